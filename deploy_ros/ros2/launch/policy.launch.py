"""ros2 launch q2real_deploy policy.launch.py bundle:=/path/policy.onnx [params:=my.yaml]"""

from pathlib import Path

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def generate_launch_description():
    defaults = Path(get_package_share_directory("q2real_deploy")) / "config" / "policy.yaml"
    return LaunchDescription(
        [
            DeclareLaunchArgument("bundle", description="policy bundle (.onnx) from `q2real export`"),
            DeclareLaunchArgument("params", default_value=str(defaults)),
            Node(
                package="q2real_deploy",
                executable="policy_node",
                name="q2real_policy",
                output="screen",
                parameters=[LaunchConfiguration("params"), {"policy.path": LaunchConfiguration("bundle")}],
            ),
        ]
    )
