"""Running an exported policy bundle on a robot through ROS 2.

The node's core sits at the top: the bundle and its per-tick policy, the observation and inputs, the
operator's requests, the tick and its schedule, the settings, and `session` (`q2real deploy`), which
puts a node together with its wings. Each wing imports the core, never the reverse:
`transport` (the node on the wire: DDS without ROS, or rclpy), `watch` (the bag, the monitor and the
operator's requests from another machine) and `learning` (on-robot learning, the robot's side, and
its link to a remote learner).
"""
