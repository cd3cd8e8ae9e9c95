"""ROS 2 wire compatibility: exact type and topic names, CDR bytes equal to an independent ROS 2
serializer (rosbags), and ROS 2's QoS. A Python-to-Python loopback would match even with a wrong type
name, so the names are asserted as strings."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cyclonedds.core import Policy
from rosbags.typesys import Stores, get_typestore

from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.commands import ForwardCommand, command_message
from q2real.deploy_ros.transport.dds import DEFAULT_QOS, SENSOR_QOS, dds_topic

STORE = get_typestore(Stores.ROS2_JAZZY)


def test_every_type_announces_rmw_cyclonedds_mangled_name() -> None:
    assert msg.dds_type_name(msg.JointState) == "sensor_msgs::msg::dds_::JointState_"
    assert msg.dds_type_name(msg.Float64MultiArray) == "std_msgs::msg::dds_::Float64MultiArray_"
    assert msg.dds_type_name(msg.JointTrajectory) == "trajectory_msgs::msg::dds_::JointTrajectory_"
    assert msg.dds_type_name(msg.Bool) == "std_msgs::msg::dds_::Bool_"
    assert msg.dds_type_name(msg.DiagnosticArray) == "diagnostic_msgs::msg::dds_::DiagnosticArray_"
    for kind, ros_name in msg.ROS_TYPES.items():
        package, _, name = ros_name.split("/")
        assert msg.dds_type_name(kind) == f"{package}::msg::dds_::{name}_"
        assert ros_name in STORE.types, f"{ros_name} is not a ROS 2 Jazzy message"


def test_topic_names_follow_rmw_cyclonedds() -> None:
    assert dds_topic("/joint_states") == "rt/joint_states"
    assert dds_topic("~/estop") == "rt/q2real_policy/estop"
    assert dds_topic("/forward_command_controller/commands") == "rt/forward_command_controller/commands"
    assert NodeConfig().command_topic() == "/forward_command_controller/commands"
    assert NodeConfig(controller="arm_controller").command_topic() == "/arm_controller/commands"
    for bad in ("", "/", "/a//b", "/a/"):
        with pytest.raises(ValueError):
            dds_topic(bad)


def test_registered_topic_carries_the_mangled_type_name(participant) -> None:
    endpoints = participant("q2real_policy")
    writer = endpoints.writer("/joint_states", msg.JointState)
    assert writer.topic.get_name() == "rt/joint_states"
    assert writer.topic.typename == "sensor_msgs::msg::dds_::JointState_"


def _samples() -> list[tuple[object, object, str]]:
    t = STORE.types
    stamp = msg.Time(sec=1_700_000_000, nanosec=123_456_789)
    header = msg.Header(stamp=stamp, frame_id="base_link")
    ros_header = t["std_msgs/msg/Header"](
        stamp=t["builtin_interfaces/msg/Time"](sec=1_700_000_000, nanosec=123_456_789), frame_id="base_link"
    )
    arr = np.array
    dim = msg.MultiArrayDimension(label="joints", size=3, stride=3)
    ros_layout = t["std_msgs/msg/MultiArrayLayout"](
        dim=[t["std_msgs/msg/MultiArrayDimension"](label="joints", size=3, stride=3)], data_offset=0
    )
    point = msg.JointTrajectoryPoint(
        positions=[0.1, 0.2], effort=[1.5, -2.0], time_from_start=msg.Duration(0, 20_000_000)
    )
    ros_point = t["trajectory_msgs/msg/JointTrajectoryPoint"](
        positions=arr([0.1, 0.2]),
        velocities=arr([], dtype=float),
        accelerations=arr([], dtype=float),
        effort=arr([1.5, -2.0]),
        time_from_start=t["builtin_interfaces/msg/Duration"](sec=0, nanosec=20_000_000),
    )
    status = msg.DiagnosticStatus(
        level=1, name="q2real", message="HOLD", hardware_id="arm", values=[msg.KeyValue("mode", "HOLD")]
    )
    ros_status = t["diagnostic_msgs/msg/DiagnosticStatus"](
        level=1,
        name="q2real",
        message="HOLD",
        hardware_id="arm",
        values=[t["diagnostic_msgs/msg/KeyValue"](key="mode", value="HOLD")],
    )
    v3 = t["geometry_msgs/msg/Vector3"]
    ros_quat = t["geometry_msgs/msg/Quaternion"](x=0.1, y=-0.2, z=0.3, w=0.927)
    ros_pose = t["geometry_msgs/msg/Pose"](
        position=t["geometry_msgs/msg/Point"](x=0.5, y=-0.1, z=0.025), orientation=ros_quat
    )
    pose = msg.Pose(msg.Point(0.5, -0.1, 0.025), msg.Quaternion(0.1, -0.2, 0.3, 0.927))
    twist = msg.Twist(msg.Vector3(0.8, -0.2, 0.0), msg.Vector3(0.0, 0.0, 0.5))
    ros_twist = t["geometry_msgs/msg/Twist"](linear=v3(x=0.8, y=-0.2, z=0.0), angular=v3(x=0.0, y=0.0, z=0.5))
    cov9, cov36 = [float(i) for i in range(9)], [i / 2 for i in range(36)]
    return [
        (
            msg.Imu(
                header=header,
                orientation=msg.Quaternion(0.1, -0.2, 0.3, 0.927),
                orientation_covariance=cov9,
                angular_velocity=msg.Vector3(0.5, -1.5, 2.0),
                angular_velocity_covariance=[-1.0] + [0.0] * 8,
                linear_acceleration=msg.Vector3(0.1, 0.2, 9.81),
            ),
            t["sensor_msgs/msg/Imu"](
                header=ros_header,
                orientation=ros_quat,
                orientation_covariance=arr(cov9),
                angular_velocity=v3(x=0.5, y=-1.5, z=2.0),
                angular_velocity_covariance=arr([-1.0] + [0.0] * 8),
                linear_acceleration=v3(x=0.1, y=0.2, z=9.81),
                linear_acceleration_covariance=arr([0.0] * 9),
            ),
            "sensor_msgs/msg/Imu",
        ),
        (msg.Twist(twist.linear, twist.angular), ros_twist, "geometry_msgs/msg/Twist"),
        (
            msg.PoseStamped(header=header, pose=pose),
            t["geometry_msgs/msg/PoseStamped"](header=ros_header, pose=ros_pose),
            "geometry_msgs/msg/PoseStamped",
        ),
        (
            msg.Odometry(
                header=header,
                child_frame_id="body",
                pose=msg.PoseWithCovariance(pose, cov36),
                twist=msg.TwistWithCovariance(twist, cov36),
            ),
            t["nav_msgs/msg/Odometry"](
                header=ros_header,
                child_frame_id="body",
                pose=t["geometry_msgs/msg/PoseWithCovariance"](pose=ros_pose, covariance=arr(cov36)),
                twist=t["geometry_msgs/msg/TwistWithCovariance"](twist=ros_twist, covariance=arr(cov36)),
            ),
            "nav_msgs/msg/Odometry",
        ),
        (
            msg.JointState(
                header=header,
                name=["shoulder", "elbow"],
                position=[0.5, -1.25],
                velocity=[0.0, 2.0],
                effort=[math.nan, 3.0],
            ),
            t["sensor_msgs/msg/JointState"](
                header=ros_header,
                name=["shoulder", "elbow"],
                position=arr([0.5, -1.25]),
                velocity=arr([0.0, 2.0]),
                effort=arr([math.nan, 3.0]),
            ),
            "sensor_msgs/msg/JointState",
        ),
        (
            msg.Float64MultiArray(layout=msg.MultiArrayLayout(dim=[dim]), data=[1.0, -2.5, 3.25]),
            t["std_msgs/msg/Float64MultiArray"](layout=ros_layout, data=arr([1.0, -2.5, 3.25])),
            "std_msgs/msg/Float64MultiArray",
        ),
        (
            msg.Float32MultiArray(layout=msg.MultiArrayLayout(dim=[dim]), data=[0.5, 0.25, -1.0]),
            t["std_msgs/msg/Float32MultiArray"](layout=ros_layout, data=arr([0.5, 0.25, -1.0], dtype=np.float32)),
            "std_msgs/msg/Float32MultiArray",
        ),
        (
            msg.JointTrajectory(header=header, joint_names=["a", "b"], points=[point]),
            t["trajectory_msgs/msg/JointTrajectory"](header=ros_header, joint_names=["a", "b"], points=[ros_point]),
            "trajectory_msgs/msg/JointTrajectory",
        ),
        (
            msg.DiagnosticArray(header=header, status=[status]),
            t["diagnostic_msgs/msg/DiagnosticArray"](header=ros_header, status=[ros_status]),
            "diagnostic_msgs/msg/DiagnosticArray",
        ),
        (msg.Bool(data=True), t["std_msgs/msg/Bool"](data=True), "std_msgs/msg/Bool"),
        (msg.Empty(), t["std_msgs/msg/Empty"](), "std_msgs/msg/Empty"),
        (msg.UInt32(data=7), t["std_msgs/msg/UInt32"](data=7), "std_msgs/msg/UInt32"),
        (msg.String(data='{"a": 1}'), t["std_msgs/msg/String"](data='{"a": 1}'), "std_msgs/msg/String"),
    ]


@pytest.mark.parametrize(("ours", "theirs", "ros_type"), _samples(), ids=lambda x: x if isinstance(x, str) else "")
def test_cdr_bytes_equal_ros2_serialization(ours, theirs, ros_type) -> None:
    expected = bytes(STORE.serialize_cdr(theirs, ros_type))
    assert ours.serialize() == expected
    assert expected[:4] == b"\x00\x01\x00\x00", "ROS 2 uses plain little-endian CDR (XCDR1)"
    decoded = STORE.deserialize_cdr(ours.serialize(), ros_type)
    assert type(ours).deserialize(expected).serialize() == expected  # and we read what ROS 2 writes
    assert decoded.__msgtype__ == ros_type


def test_qos_is_ros2_default_for_commands_and_sensor_data_for_joint_states(participant) -> None:
    endpoints = participant("q2real_policy")
    writer = endpoints.writer("/forward_command_controller/commands", msg.Float64MultiArray)
    reader = endpoints.reader("/joint_states", msg.JointState, qos=SENSOR_QOS)
    for qos in (DEFAULT_QOS, writer.get_qos()):
        assert Policy.Reliability.Reliable(max_blocking_time=100_000_000) in qos
        assert Policy.Durability.Volatile in qos
        assert Policy.History.KeepLast(10) in qos
    for qos in (SENSOR_QOS, reader.get_qos()):
        assert Policy.Reliability.BestEffort in qos
        assert Policy.Durability.Volatile in qos
        assert Policy.History.KeepLast(5) in qos


@pytest.mark.parametrize("joints", [1, 2, 7, 12, 29])
@pytest.mark.parametrize("use_version_2", [None, False, True])
def test_the_preserialized_forward_command_is_the_serializers_bytes(joints: int, use_version_2) -> None:
    """Each tick's doubles are written into bytes serialized once: tick after tick, they must be what
    the serializer (and ROS 2's, for XCDR1) writes for the same values, NaN and signed zeros included."""
    command = ForwardCommand(msg, joints)
    rng = np.random.default_rng(joints)
    for values in (
        rng.normal(0, 3, joints),
        np.full(joints, -0.0),
        np.full(joints, np.nan),
        rng.normal(0, 1e300, joints),
    ):
        command.set(values)
        ours = command.message.serialize(use_version_2=use_version_2)
        reference = command_message(msg, "forward", "position", [""] * joints, values, 0.0, None)
        assert ours == reference.serialize(use_version_2=use_version_2) and command.last == ours
        if not use_version_2:
            ros = STORE.deserialize_cdr(ours, "std_msgs/msg/Float64MultiArray")
            np.testing.assert_array_equal(ros.data, values)
