"""The node on the wire: ROS 2 over DDS without a ROS install (`dds`) or through rclpy (`rclpy_node`),
both publishing the same command and diagnostics messages from the same core."""
