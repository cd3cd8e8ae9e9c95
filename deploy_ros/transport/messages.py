"""ROS 2 message types on the DDS wire, for talking to ROS 2 nodes from a machine without ROS.

rmw_cyclonedds names a message type `<pkg>::msg::dds_::<Type>_` and encodes it as plain CDR
(XCDR1), so each struct here is `@final` (an appendable struct switches to XCDR2 and never matches
a ROS 2 endpoint) and carries the mangled name; the binding turns the dots into `::`. Field order
and types follow the `.msg` definitions exactly, because CDR has no field names: the bytes are
checked against an independent ROS 2 serializer (rosbags) in the tests.

No `from __future__ import annotations` here: cyclonedds resolves the field annotations at runtime.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cyclonedds.idl import IdlStruct
from cyclonedds.idl.annotations import final
from cyclonedds.idl.types import float32, float64, int32, uint8, uint32

if TYPE_CHECKING:  # at run time `sequence[T]` is Annotated[Sequence[T], <IDL bounds>]; a checker needs the Sequence
    from collections.abc import Sequence as sequence
    from typing import TypeAlias

    Covariance9: TypeAlias = sequence[float]
    Covariance36: TypeAlias = sequence[float]
else:
    from cyclonedds.idl.types import array, sequence

    Covariance9, Covariance36 = array[float64, 9], array[float64, 36]


def _name(ros_type: str) -> str:
    """'sensor_msgs/msg/JointState' -> 'sensor_msgs.msg.dds_.JointState_' (the binding's spelling)."""
    package, kind, name = ros_type.split("/")
    return f"{package}.{kind}.dds_.{name}_"


@dataclass
@final
class Time(IdlStruct, typename=_name("builtin_interfaces/msg/Time")):
    sec: int32 = 0
    nanosec: uint32 = 0


@dataclass
@final
class Duration(IdlStruct, typename=_name("builtin_interfaces/msg/Duration")):
    sec: int32 = 0
    nanosec: uint32 = 0


@dataclass
@final
class Header(IdlStruct, typename=_name("std_msgs/msg/Header")):
    stamp: Time = field(default_factory=Time)
    frame_id: str = ""


@dataclass
@final
class Bool(IdlStruct, typename=_name("std_msgs/msg/Bool")):
    data: bool = False


@dataclass
@final
class UInt32(IdlStruct, typename=_name("std_msgs/msg/UInt32")):
    data: uint32 = 0


@dataclass
@final
class String(IdlStruct, typename=_name("std_msgs/msg/String")):
    data: str = ""


@dataclass
@final
class Empty(IdlStruct, typename=_name("std_msgs/msg/Empty")):
    # ROS 2 gives empty messages this one placeholder byte so that the IDL struct is legal.
    structure_needs_at_least_one_member: uint8 = 0


@dataclass
@final
class Float64(IdlStruct, typename=_name("std_msgs/msg/Float64")):
    data: float64 = 0.0


@dataclass
@final
class MultiArrayDimension(IdlStruct, typename=_name("std_msgs/msg/MultiArrayDimension")):
    label: str = ""
    size: uint32 = 0
    stride: uint32 = 0


@dataclass
@final
class MultiArrayLayout(IdlStruct, typename=_name("std_msgs/msg/MultiArrayLayout")):
    dim: sequence[MultiArrayDimension] = field(default_factory=list)
    data_offset: uint32 = 0


@dataclass
@final
class Float64MultiArray(IdlStruct, typename=_name("std_msgs/msg/Float64MultiArray")):
    layout: MultiArrayLayout = field(default_factory=MultiArrayLayout)
    data: sequence[float64] = field(default_factory=list)


@dataclass
@final
class Float32MultiArray(IdlStruct, typename=_name("std_msgs/msg/Float32MultiArray")):
    layout: MultiArrayLayout = field(default_factory=MultiArrayLayout)
    data: sequence[float32] = field(default_factory=list)


@dataclass
@final
class JointState(IdlStruct, typename=_name("sensor_msgs/msg/JointState")):
    header: Header = field(default_factory=Header)
    name: sequence[str] = field(default_factory=list)
    position: sequence[float64] = field(default_factory=list)
    velocity: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)


@dataclass
@final
class JointTrajectoryPoint(IdlStruct, typename=_name("trajectory_msgs/msg/JointTrajectoryPoint")):
    positions: sequence[float64] = field(default_factory=list)
    velocities: sequence[float64] = field(default_factory=list)
    accelerations: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)
    time_from_start: Duration = field(default_factory=Duration)


@dataclass
@final
class JointTrajectory(IdlStruct, typename=_name("trajectory_msgs/msg/JointTrajectory")):
    header: Header = field(default_factory=Header)
    joint_names: sequence[str] = field(default_factory=list)
    points: sequence[JointTrajectoryPoint] = field(default_factory=list)


@dataclass
@final
class Vector3(IdlStruct, typename=_name("geometry_msgs/msg/Vector3")):
    x: float64 = 0.0
    y: float64 = 0.0
    z: float64 = 0.0


@dataclass
@final
class Point(IdlStruct, typename=_name("geometry_msgs/msg/Point")):
    x: float64 = 0.0
    y: float64 = 0.0
    z: float64 = 0.0


@dataclass
@final
class Quaternion(IdlStruct, typename=_name("geometry_msgs/msg/Quaternion")):
    # ROS order (x, y, z, w); MuJoCo's is (w, x, y, z).
    x: float64 = 0.0
    y: float64 = 0.0
    z: float64 = 0.0
    w: float64 = 1.0


@dataclass
@final
class Pose(IdlStruct, typename=_name("geometry_msgs/msg/Pose")):
    position: Point = field(default_factory=Point)
    orientation: Quaternion = field(default_factory=Quaternion)


@dataclass
@final
class PoseStamped(IdlStruct, typename=_name("geometry_msgs/msg/PoseStamped")):
    header: Header = field(default_factory=Header)
    pose: Pose = field(default_factory=Pose)


@dataclass
@final
class Twist(IdlStruct, typename=_name("geometry_msgs/msg/Twist")):
    linear: Vector3 = field(default_factory=Vector3)
    angular: Vector3 = field(default_factory=Vector3)


@dataclass
@final
class PoseWithCovariance(IdlStruct, typename=_name("geometry_msgs/msg/PoseWithCovariance")):
    pose: Pose = field(default_factory=Pose)
    covariance: Covariance36 = field(default_factory=lambda: [0.0] * 36)


@dataclass
@final
class TwistWithCovariance(IdlStruct, typename=_name("geometry_msgs/msg/TwistWithCovariance")):
    twist: Twist = field(default_factory=Twist)
    covariance: Covariance36 = field(default_factory=lambda: [0.0] * 36)


@dataclass
@final
class Imu(IdlStruct, typename=_name("sensor_msgs/msg/Imu")):
    header: Header = field(default_factory=Header)
    orientation: Quaternion = field(default_factory=Quaternion)
    orientation_covariance: Covariance9 = field(default_factory=lambda: [0.0] * 9)
    """Element 0 is -1 when the IMU gives no orientation estimate (REP 145)."""
    angular_velocity: Vector3 = field(default_factory=Vector3)
    angular_velocity_covariance: Covariance9 = field(default_factory=lambda: [0.0] * 9)
    linear_acceleration: Vector3 = field(default_factory=Vector3)
    linear_acceleration_covariance: Covariance9 = field(default_factory=lambda: [0.0] * 9)


@dataclass
@final
class Odometry(IdlStruct, typename=_name("nav_msgs/msg/Odometry")):
    header: Header = field(default_factory=Header)
    child_frame_id: str = ""
    pose: PoseWithCovariance = field(default_factory=PoseWithCovariance)
    """In `header.frame_id`."""
    twist: TwistWithCovariance = field(default_factory=TwistWithCovariance)
    """In `child_frame_id` (the base)."""


@dataclass
@final
class KeyValue(IdlStruct, typename=_name("diagnostic_msgs/msg/KeyValue")):
    key: str = ""
    value: str = ""


@dataclass
@final
class DiagnosticStatus(IdlStruct, typename=_name("diagnostic_msgs/msg/DiagnosticStatus")):
    OK = 0
    WARN = 1
    ERROR = 2
    STALE = 3
    level: uint8 = 0
    name: str = ""
    message: str = ""
    hardware_id: str = ""
    values: sequence[KeyValue] = field(default_factory=list)


@dataclass
@final
class DiagnosticArray(IdlStruct, typename=_name("diagnostic_msgs/msg/DiagnosticArray")):
    header: Header = field(default_factory=Header)
    status: sequence[DiagnosticStatus] = field(default_factory=list)


ROS_TYPES: dict[type[IdlStruct], str] = {
    Time: "builtin_interfaces/msg/Time",
    Duration: "builtin_interfaces/msg/Duration",
    Header: "std_msgs/msg/Header",
    Bool: "std_msgs/msg/Bool",
    Empty: "std_msgs/msg/Empty",
    UInt32: "std_msgs/msg/UInt32",
    String: "std_msgs/msg/String",
    Float64: "std_msgs/msg/Float64",
    MultiArrayDimension: "std_msgs/msg/MultiArrayDimension",
    MultiArrayLayout: "std_msgs/msg/MultiArrayLayout",
    Float64MultiArray: "std_msgs/msg/Float64MultiArray",
    Float32MultiArray: "std_msgs/msg/Float32MultiArray",
    JointState: "sensor_msgs/msg/JointState",
    JointTrajectoryPoint: "trajectory_msgs/msg/JointTrajectoryPoint",
    JointTrajectory: "trajectory_msgs/msg/JointTrajectory",
    Vector3: "geometry_msgs/msg/Vector3",
    Point: "geometry_msgs/msg/Point",
    Quaternion: "geometry_msgs/msg/Quaternion",
    Pose: "geometry_msgs/msg/Pose",
    PoseStamped: "geometry_msgs/msg/PoseStamped",
    Twist: "geometry_msgs/msg/Twist",
    PoseWithCovariance: "geometry_msgs/msg/PoseWithCovariance",
    TwistWithCovariance: "geometry_msgs/msg/TwistWithCovariance",
    Imu: "sensor_msgs/msg/Imu",
    Odometry: "nav_msgs/msg/Odometry",
    KeyValue: "diagnostic_msgs/msg/KeyValue",
    DiagnosticStatus: "diagnostic_msgs/msg/DiagnosticStatus",
    DiagnosticArray: "diagnostic_msgs/msg/DiagnosticArray",
}
"""Each wire type's ROS 2 name (what `ros2 topic info` shows and rosbag2 records)."""


def dds_type_name(message: type[IdlStruct]) -> str:
    """The type name this struct announces on the wire, e.g. 'sensor_msgs::msg::dds_::JointState_'."""
    return message.__idl_typename__.replace(".", "::")
