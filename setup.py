"""Maps each top-level folder to `q2real.<folder>`; sub-packages are discovered so none is left out of a wheel."""

from setuptools import find_namespace_packages, setup

NAMESPACE = "q2real"
FOLDERS = ["sim", "agents", "residual", "safety", "deploy_ros", "contracts", "configs", "hardware", "gate", "cli"]

setup(
    package_dir={f"{NAMESPACE}.{folder}": folder for folder in FOLDERS},
    packages=[
        f"{NAMESPACE}.{folder}{'.' + sub if sub else ''}"
        for folder in FOLDERS
        # deploy_ros/ros2 is a ROS 2 (ament_python) package of its own, built by colcon, not part of q2real.
        for sub in ["", *find_namespace_packages(folder, exclude=["*__pycache__*", "ros2", "ros2.*"])]
    ],
)
