"""Command and diagnostics messages, built once for both transports.

The functions take the message namespace as an argument: `q2real.deploy_ros.transport.messages` on DDS, or a
namespace of rclpy's generated classes on ROS 2. Both have the same class and field names, so the
node's output is identical on either transport.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def stamp_now(msgs: Any):
    """The wall-clock time as builtin_interfaces/Time (ROS 2 stamps are wall-clock unless sim time)."""
    nanoseconds = time.time_ns()
    return msgs.Time(sec=nanoseconds // 1_000_000_000, nanosec=nanoseconds % 1_000_000_000)


def duration(msgs: Any, seconds: float):
    nanoseconds = int(round(seconds * 1e9))
    return msgs.Duration(sec=nanoseconds // 1_000_000_000, nanosec=nanoseconds % 1_000_000_000)


def command_message(msgs: Any, style: str, interface: str, names: list[str], values: np.ndarray, period: float, stamp):
    """`forward`: Float64MultiArray (joint order is the controller's `joints` parameter, which must be
    the bundle's); `trajectory`: one JointTrajectory point, reached one control period from now, with
    `positions` or, on an effort `interface`, `effort`."""
    data = [float(v) for v in values]
    if style == "forward":
        dim = msgs.MultiArrayDimension(label="joints", size=len(data), stride=len(data))
        return msgs.Float64MultiArray(layout=msgs.MultiArrayLayout(dim=[dim], data_offset=0), data=data)
    values_field = "effort" if interface == "effort" else "positions"
    point = msgs.JointTrajectoryPoint(**{values_field: data}, time_from_start=duration(msgs, period))
    return msgs.JointTrajectory(header=msgs.Header(stamp=stamp, frame_id=""), joint_names=list(names), points=[point])


class ForwardCommand:
    """std_msgs/Float64MultiArray for a fixed number of joints, serialized once: each tick writes its
    doubles into the serialized bytes in place, instead of building message objects and running
    cyclonedds' Python serializer (about 35 us a tick). The CDR is the serializer's own, for whichever
    representation the writer asks for; `tests/deploy_ros/test_wire.py` holds it to the serializer."""

    def __init__(self, msgs: Any, joints: int):
        self.message = command_message(msgs, "forward", "position", [""] * joints, np.zeros(joints), 0.0, None)
        self._joints = joints
        self._serialized: dict[bool | None, tuple[bytearray, np.ndarray]] = {}
        self._values = np.zeros(joints)
        self.last = b""
        """The bytes of the latest command written (what a recorder stores)."""
        # cyclonedds' DataWriter.write checks the type, then asks the sample for its bytes.
        self.message.serialize = self._serialize

    def set(self, values: np.ndarray) -> None:
        np.copyto(self._values, values)

    def _serialize(self, use_version_2: bool | None = None) -> bytes:
        entry = self._serialized.get(use_version_2)
        if entry is None:
            template = bytearray(type(self.message).serialize(self.message, use_version_2=use_version_2))
            # The doubles are the last field: the last 8 n bytes, aligned, with no padding after them.
            data = np.frombuffer(template, dtype="<f8", count=self._joints, offset=len(template) - 8 * self._joints)
            entry = self._serialized[use_version_2] = (template, data)
        template, data = entry
        data[:] = self._values
        self.last = bytes(template)
        return self.last


def command_values(message, style: str, names: list[str]) -> np.ndarray | str:
    """The per-joint values of a command message in `names` order, or why it is unusable."""
    if style == "forward":
        values = np.asarray(message.data, dtype=float)
        if values.shape != (len(names),):
            return f"expected {len(names)} values, got {values.size}"
        return values
    if not message.points:
        return "trajectory without points"
    point = message.points[0]
    field = point.positions if len(point.positions) else point.effort
    order = {name: i for i, name in enumerate(message.joint_names)}
    if sorted(order) != sorted(names) or len(field) != len(names):
        return f"trajectory joints {list(message.joint_names)} / {len(field)} values do not match {names}"
    return np.array([field[order[name]] for name in names], dtype=float)


def diagnostics_message(msgs: Any, report: dict, hardware_id: str, stamp):
    status = msgs.DiagnosticStatus(
        level=report["level"],
        name="q2real_policy: shield",
        message=report["message"],
        hardware_id=hardware_id,
        values=[msgs.KeyValue(key=k, value=v) for k, v in report["values"].items()],
    )
    return msgs.DiagnosticArray(header=msgs.Header(stamp=stamp, frame_id=""), status=[status])
