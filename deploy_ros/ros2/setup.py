"""ament_python wrapper: `ros2 run q2real_deploy policy_node`. The node itself is q2real's
(`pip install "q2real[deploy]"` into the Python that ROS 2 uses)."""

from setuptools import setup

PACKAGE = "q2real_deploy"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=[],
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", ["launch/policy.launch.py"]),
        (f"share/{PACKAGE}/config", ["config/policy.yaml"]),
    ],
    install_requires=["setuptools"],
    entry_points={"console_scripts": ["policy_node = q2real.deploy_ros.transport.rclpy_node:main"]},
)
