"""The bag holds what the robot sent as well as what the node answered, and a reader that shares no
code with the writer (mcap-ros2-support, from the MCAP's own schemas) decodes every topic."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
from mcap_ros2.reader import read_ros2_messages

from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.watch.recorder import Recorder

INPUTS = {
    "/joint_states": msg.JointState,
    "/q2real_policy/estop": msg.Bool,
    "/q2real_policy/reset": msg.Empty,
    "/q2real_policy/command": msg.Float64MultiArray,
    "/imu/data": msg.Imu,
    "/cmd_vel": msg.Twist,
    "/object_pose": msg.PoseStamped,
}


def _joint_state(angle: float) -> msg.JointState:
    stamp = msg.Time(sec=12, nanosec=345)
    return msg.JointState(
        header=msg.Header(stamp=stamp, frame_id=""), name=["hinge"], position=[angle], velocity=[-0.5], effort=[]
    )


def test_every_input_and_output_topic_decodes_with_an_independent_reader(pendulum_bundle: Path, tmp_path: Path) -> None:
    node = PolicyNode(pendulum_bundle, NodeConfig(autostart=True, require_subscriber=False))
    recorder = Recorder(tmp_path / "bag", "/effort_controller/commands", msg.Float64MultiArray, {"x": 1}, INPUTS)
    now = time.monotonic()
    for i in range(30):
        state = _joint_state(0.01 * i)
        recorder.write_input("/joint_states", state)
        node.on_joint_state(state.name, state.position, state.velocity, state.effort, received=now)
        tick = node.tick(now)
        recorder.write(tick, msg.Float64MultiArray(data=[float(v) for v in tick.values]))
        now += node.period
    recorder.write_input("/q2real_policy/estop", msg.Bool(data=True))
    recorder.write_input("/q2real_policy/reset", msg.Empty())
    recorder.write_input("/q2real_policy/command", msg.Float64MultiArray(data=[0.25]))
    imu = msg.Imu(header=msg.Header(stamp=msg.Time(sec=1, nanosec=2), frame_id="base"))
    imu.angular_velocity = msg.Vector3(x=0.1, y=0.2, z=0.3)
    recorder.write_input("/imu/data", imu)
    recorder.write_input("/cmd_vel", msg.Twist(linear=msg.Vector3(x=0.5, y=0.0, z=0.0)))
    pose = msg.PoseStamped(header=msg.Header(stamp=msg.Time(sec=3, nanosec=4), frame_id="world"))
    pose.pose.position = msg.Point(x=0.4, y=-0.1, z=0.02)
    recorder.write_input("/object_pose", pose)
    recorder.close()

    (bag,) = (tmp_path / "bag").glob("*.mcap")
    seen: dict[str, list] = {}
    for decoded in read_ros2_messages(str(bag)):
        seen.setdefault(decoded.channel.topic, []).append(decoded.ros_msg)
    assert set(INPUTS) <= set(seen), sorted(seen)
    states = seen["/joint_states"]
    assert len(states) == 30 and list(states[5].name) == ["hinge"] and math.isclose(states[5].position[0], 0.05)
    assert (states[0].header.stamp.sec, states[0].header.stamp.nanosec) == (12, 345)
    assert seen["/q2real_policy/estop"][0].data is True and list(seen["/q2real_policy/command"][0].data) == [0.25]
    assert math.isclose(seen["/imu/data"][0].angular_velocity.z, 0.3) and seen["/imu/data"][0].header.frame_id == "base"
    assert math.isclose(seen["/cmd_vel"][0].linear.x, 0.5)
    assert math.isclose(seen["/object_pose"][0].pose.position.x, 0.4)
    # The node's side of the same ticks.
    commands = [list(m.data) for m in seen["/effort_controller/commands"]]
    assert len(commands) == 30 and np.isfinite(commands).all()
    assert len(seen["/q2real_policy/shield_mode"]) == 30 and len(seen["/q2real_policy/bundle"]) == 1


def test_a_message_the_bag_cannot_hold_costs_that_message_not_the_rest_of_the_bag(
    pendulum_bundle: Path, tmp_path: Path
) -> None:
    node = PolicyNode(pendulum_bundle, NodeConfig(autostart=True, require_subscriber=False))
    recorder = Recorder(tmp_path / "bag", "/effort_controller/commands", msg.Float64MultiArray, {"x": 1}, INPUTS)
    recorder.write_input("/not_an_input", msg.Empty())
    now = time.monotonic()
    for i in range(5):
        state = _joint_state(0.01 * i)
        node.on_joint_state(state.name, state.position, state.velocity, state.effort, received=now)
        tick = node.tick(now)
        recorder.write(tick, msg.Float64MultiArray(data=[float(v) for v in tick.values]))
        now += node.period
    recorder.close()
    assert recorder.lost == 1 and "/not_an_input" in recorder.first_error
    (bag,) = (tmp_path / "bag").glob("*.mcap")
    commands = [m for m in read_ros2_messages(str(bag)) if m.channel.topic == "/effort_controller/commands"]
    assert len(commands) == 5
