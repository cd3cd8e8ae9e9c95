"""Running an exported policy bundle on a robot through ROS 2."""
