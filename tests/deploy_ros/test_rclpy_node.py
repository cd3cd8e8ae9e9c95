"""The rclpy transport against the same node core, on a machine with ROS 2 (rclpy is not on PyPI or
Debian, so CI skips this file; the DDS transport tests cover the core and the wire there)."""

from __future__ import annotations

import math
import time

import pytest

rclpy = pytest.importorskip(
    "rclpy", reason="rclpy is not installed: ROS 2 is not on PyPI or Debian; run on a ROS 2 machine (e.g. ros:jazzy)"
)

from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from std_msgs.msg import Bool, Float64MultiArray  # noqa: E402

from q2real.deploy_ros.rclpy_node import RclpyPolicyNode  # noqa: E402
from q2real.safety.flags import Mode  # noqa: E402


def test_rclpy_node_runs_the_core_and_latches_estop(pendulum_bundle) -> None:
    args = ["--ros-args", "-p", f"policy.path:={pendulum_bundle}", "-p", "autostart:=true"]
    args += ["-p", "shield.ramp_time:=0.1"]
    rclpy.init(args=args)
    try:
        node = RclpyPolicyNode()
        robot = rclpy.create_node("fake_robot")
        commands: list[list[float]] = []
        robot.create_subscription(
            Float64MultiArray, "/forward_command_controller/commands", lambda m: commands.append(list(m.data)), 10
        )
        states = robot.create_publisher(JointState, "/joint_states", 10)
        estop = robot.create_publisher(Bool, "/q2real_policy/estop", 10)
        executor = MultiThreadedExecutor()
        executor.add_node(node)
        executor.add_node(robot)
        start = time.monotonic()
        while time.monotonic() - start < 2.0:
            states.publish(JointState(name=["hinge"], position=[0.1], velocity=[0.0], effort=[math.nan]))
            executor.spin_once(timeout_sec=0.01)
        assert node.core.shield.mode == Mode.RUN
        assert commands and all(abs(c[0]) <= 2.0 for c in commands)
        estop.publish(Bool(data=True))
        start = time.monotonic()
        while time.monotonic() - start < 0.5:
            states.publish(JointState(name=["hinge"], position=[0.1], velocity=[0.0], effort=[math.nan]))
            executor.spin_once(timeout_sec=0.01)
        assert node.core.shield.mode == Mode.ESTOP
    finally:
        rclpy.try_shutdown()
