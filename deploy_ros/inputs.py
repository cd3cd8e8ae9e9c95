"""The node's inputs beside joint states: the base IMU, a velocity command and a tracked object's pose.

Each stream keeps its newest valid reading and when it arrived (the node's monotonic clock), and has
its own age limit (`inputs.*`): the IMU feeds a balancing policy, so a stale or non-finite IMU drops
RUN to DAMP, never to a stiff hold, on any robot; a stale object pose falls back like a joint-state
fault; a velocity command that stops arriving means standing still (zero), not the last speed.

The IMU (REP 145) reports its frame's orientation in a gravity-aligned world frame and its angular
velocity in its own frame. With R_bi the mounting rotation of the IMU frame in the base frame (the
robot spec's `imu.rotation`) the base-frame quantities the tasks observe in simulation are
    projected_gravity      g_b = R_bi R_wi^T (0, 0, -1)
    base_angular_velocity  w_b = R_bi w_i
Messages are read by field name, so DDS and rclpy messages go through the same code.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from q2real.contracts.schema import BundleError, brief
from q2real.deploy_ros.observation import ObservationBuilder
from q2real.hardware.spec import ImuSpec
from q2real.safety.flags import Mode

STREAMS = (
    ("imu", "imu", "Imu", "on_imu"),
    ("velocity_command", "cmd_vel", "Twist", "on_velocity_command"),
    ("object_pose", "object_pose", "PoseStamped", "on_object_pose"),
)
"""(stream, its `topics.*` key, message type name, `PolicyNode` handler) for both transports; each
subscribes with sensor-data QoS (best effort), which matches RELIABLE and BEST_EFFORT publishers."""
UNIT_TOLERANCE = 0.01
"""How far from 1 an orientation quaternion's norm may be before the reading is refused."""


def rotation_matrix(w: float, x: float, y: float, z: float) -> np.ndarray:
    """The rotation of a unit quaternion (w, x, y, z) as a 3x3 matrix (frame axes as columns)."""
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def imu_in_base(orientation_xyzw, angular_velocity, mount: np.ndarray) -> tuple[np.ndarray, np.ndarray] | str:
    """(projected gravity, angular velocity) in the base frame from one IMU reading, or why it is unusable.

    `orientation_xyzw` in ROS order; `mount` the 3x3 rotation of the IMU frame in the base frame."""
    quat = np.asarray(orientation_xyzw, dtype=float)
    omega = np.asarray(angular_velocity, dtype=float)
    if not (np.isfinite(quat).all() and np.isfinite(omega).all()):
        return "nonfinite: an orientation or angular velocity component is NaN or infinite"
    norm = math.sqrt(float(quat @ quat))
    if abs(norm - 1.0) > UNIT_TOLERANCE:
        return f"orientation: not a unit quaternion (norm {norm:.4g}); is the IMU's orientation filter running?"
    x, y, z, w = quat / norm
    world_from_imu = rotation_matrix(w, x, y, z)
    return mount @ -world_from_imu[2], mount @ omega


@dataclass(frozen=True)
class Reading:
    values: dict[str, np.ndarray]
    """By observation kind (`projected_gravity`, `velocity_command`, ...)."""
    received: float


def _fresh(reading: Reading | None, limit: float, now: float) -> bool:
    """Within `limit` of `now` either way: a reading that arrived while the tick ran is newer than the
    tick's clock, and fresh; one from a clock that jumped is not."""
    return reading is not None and -limit <= now - reading.received <= limit


class Inputs:
    """Newest readings of the streams a bundle reads, their faults and their timeouts.

    Handlers run on transport threads and replace one reference each; the tick reads them.
    """

    def __init__(self, builder: ObservationBuilder, config, imu: ImuSpec | None, topics, source: str):
        self.config, self.topics = config, topics
        self.streams = builder.streams
        if "imu" in self.streams and imu is None:
            raise BundleError(f"{source}: the policy observes the base IMU, but the bundle's robot has no imu section")
        self._mount = rotation_matrix(*imu.rotation) if imu is not None else np.eye(3)
        self._ranges = builder.velocity_ranges
        self.object_frame = builder.object_frame
        self._imu: Reading | None = None
        self._imu_faults = 0
        """Refused IMU messages so far; the tick compares it with the count it last saw, so a NaN
        between two ticks damps too (one writer: the IMU's delivery thread)."""
        self._imu_faults_seen = 0
        self._imu_fault = ""
        self._velocity: Reading | None = None
        self._object: Reading | None = None
        self._zero_velocity = {"velocity_command": np.zeros(3)}
        self.events: Counter[str] = Counter()
        """Faults and timeouts by stream, counted once per onset (e.g. 'imu.stale'); clipped velocity
        commands by message."""
        self._active: set[str] = set()

    # --- handlers (transport threads) ---------------------------------------------------------------
    def on_imu(self, message, received: float) -> str | None:
        if "imu" not in self.streams:
            return None
        o, w = message.orientation, message.angular_velocity
        frame = self.config.imu_frame_id
        if frame is not None and message.header.frame_id != frame:
            reason = f"frame_id {brief(message.header.frame_id)}, expected {frame!r} (inputs.imu_frame_id)"
        elif message.orientation_covariance[0] == -1.0:
            reason = "orientation: the IMU reports none (orientation_covariance[0] = -1); projected gravity needs it"
        else:
            result = imu_in_base((o.x, o.y, o.z, o.w), (w.x, w.y, w.z), self._mount)
            limit = self.config.max_angular_velocity
            if not isinstance(result, str) and not np.abs(result[1]).max() <= limit:
                result = f"angular_velocity: {brief(np.round(result[1], 3).tolist())} rad/s beyond the gyro's {limit}"
            if not isinstance(result, str):
                gravity, omega = result
                self._imu = Reading({"projected_gravity": gravity, "base_angular_velocity": omega}, received)
                return None
            reason = result
        self._imu_fault = f"imu: {self.topics.imu}: {reason}"
        self._imu_faults += 1
        return self._imu_fault

    def on_velocity_command(self, message, received: float) -> str | None:
        if self._ranges is None:
            return None
        linear, angular = message.linear, message.angular
        every = [linear.x, linear.y, linear.z, angular.x, angular.y, angular.z]
        if not np.isfinite(every).all():
            # Not the last speed until the timeout: a garbled command means stop now.
            self._velocity = Reading(self._zero_velocity, received)
            return f"velocity_command: {self.topics.cmd_vel}: a component is NaN or infinite: {brief(every)}"
        raw = np.array([linear.x, linear.y, angular.z], dtype=float)
        value = np.clip(raw, self._ranges[:, 0], self._ranges[:, 1])
        if (value != raw).any():
            self.events["velocity_command.clipped"] += 1
        self._velocity = Reading({"velocity_command": value}, received)
        return None

    def on_object_pose(self, message, received: float) -> str | None:
        if self.object_frame is None:
            return None
        frame = message.header.frame_id
        if frame != self.object_frame:
            return (
                f"object_pose: {self.topics.object_pose}: frame_id {brief(frame)}, the policy was trained on "
                f"positions in {self.object_frame!r}"
            )
        p = message.pose.position
        position = np.array([p.x, p.y, p.z], dtype=float)
        limit = self.config.max_object_distance
        if not np.linalg.norm(position) <= limit:  # NaN fails too
            return (
                f"object_pose: {self.topics.object_pose}: position {brief(position.tolist())} is not finite or "
                f"beyond max_object_distance ({limit} m)"
            )
        self._object = Reading({"object_position": position}, received)
        return None

    # --- the tick --------------------------------------------------------------------------------------
    def _onset(self, event: str, active: bool) -> None:
        if active and event not in self._active:
            self.events[event] += 1
        (self._active.add if active else self._active.discard)(event)

    def fault(self, now: float) -> tuple[str, Mode | None] | None:
        """Why the policy may not run on these inputs now, and the mode to fall back to (None: the
        shield's configured fallback); None when every stream the bundle reads is usable."""
        found: tuple[str, Mode | None] | None = None
        if "imu" in self.streams:
            faults = self._imu_faults
            bad = self._imu_fault if faults != self._imu_faults_seen else ""
            self._imu_faults_seen = faults
            reading, limit = self._imu, self.config.imu_max_age
            stale = not _fresh(reading, limit, now)
            self._onset("imu.nonfinite_or_invalid", bool(bad))
            self._onset("imu.stale", stale)
            if bad or stale:
                found = (bad or f"imu: no valid reading on {self.topics.imu} within imu_max_age ({limit} s)", Mode.DAMP)
        if "object_pose" in self.streams and found is None:
            stale = not _fresh(self._object, self.config.object_max_age, now)
            limit = self.config.object_max_age
            self._onset("object_pose.stale", stale)
            if stale:
                found = (f"object_pose: no pose on {self.topics.object_pose} within object_max_age ({limit} s)", None)
        return found

    def values(self, now: float) -> dict[str, np.ndarray]:
        """The newest reading of every stream by observation kind; a velocity command older than its
        timeout (or none yet) is zero."""
        values: dict[str, np.ndarray] = {}
        for reading in (self._imu, self._object):
            if reading is not None:
                values |= reading.values
        if self._ranges is not None:
            reading = self._velocity
            timed_out = not _fresh(reading, self.config.velocity_command_timeout, now)
            self._onset("velocity_command.timeout", timed_out and reading is not None)
            values |= self._zero_velocity if timed_out or reading is None else reading.values
        return values

    def ages(self, now: float) -> dict[str, float]:
        """Seconds since each stream's newest valid reading (inf: none yet), for diagnostics."""
        readings = {"imu": self._imu, "velocity_command": self._velocity, "object_pose": self._object}
        return {
            name: now - r.received if r is not None else math.inf
            for name, r in readings.items()
            if name in self.streams
        }
