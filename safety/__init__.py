"""The safety shield between a policy and a physical robot (plain numpy; no ROS, torch or JAX)."""
