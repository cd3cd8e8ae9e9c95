"""Before a robot is touched: a run's policy bundle, shielded, on the other backend and through the ROS 2 node."""
