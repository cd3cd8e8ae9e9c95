"""What the operator watches besides the shield: how the task goes, computed by the node from the inputs
it already reads, never from anything the robot does not measure.

From the observation the policy ran on (each term's source kind says what its values are):
  tilt_deg          the base's tilt from vertical, from the IMU's orientation (`projected_gravity`);
                    `falls`: how often it went past the task's fall tilt (`figures.fall_tilt`)
  yaw_rate          the IMU's yaw rate (`base_angular_velocity`) beside the commanded velocity (`cmd_*`,
                    from `velocity_command`), and their mean absolute difference
  distance_m        to the target (`command`): of the tracked object (`object_position`, push), or of the
                    point `figures.point` by forward kinematics (reach), in the target's dimensions;
                    with `figures.within`, the share of samples inside that radius
A legged base's linear velocity and height are not among them: the node has no state estimator (the
sim robot prints its ground truth, labelled so). Figures are sampled on the diagnostics thread from
the newest RUN tick, every diagnostics period: a tick only hands over references.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from q2real.contracts.schema import BundleError, brief

if TYPE_CHECKING:  # the monitor reads `figures_line` without the node's compiled observation builder
    from q2real.deploy_ros.observation import Kinematics, ObservationBuilder

_KEYS = {"fall_tilt", "point", "within"}
_POINT_KEYS = {"kind", "joints", "body", "offset"}


@dataclass
class Tally:
    """The samples of a run so far, for the end summary."""

    samples: int = 0
    tilt_sum: float = 0.0
    tilt_max: float = 0.0
    falls: int = 0
    fallen: bool = False
    yaw_error_sum: float = 0.0
    distance_min: float = math.inf
    within: int = 0


class TaskFigures:
    """The figures a bundle's observation and `figures` section allow (none for a pendulum)."""

    def __init__(self, metadata: dict, observation: ObservationBuilder, load_model: Callable[[], Any], source: str):
        section = metadata.get("figures") or {}
        where = f"{source}: metadata.figures"
        if not isinstance(section, dict) or set(section) - _KEYS:
            raise BundleError(f"{where}: expected an object with keys among {sorted(_KEYS)}, got {brief(section)}")
        spans = observation.spans
        self._gravity = spans.get("projected_gravity")
        self._gyro = spans.get("base_angular_velocity")
        self._velocity = spans.get("velocity_command")
        self._target = spans.get("command")
        self._object = spans.get("object_position")
        self.fall_tilt = _angle(section.get("fall_tilt"), f"{where}.fall_tilt")
        self.within = _radius(section.get("within"), f"{where}.within")
        self._point: tuple[Kinematics, np.ndarray] | None = None
        if section.get("point") is not None:
            self._point = _point(section["point"], metadata["robot"]["joint_names"], load_model, f"{where}.point")
        self.latest: tuple[np.ndarray, np.ndarray] | None = None
        """The newest RUN tick's observation and measured joint positions (bundle order), set by the tick."""
        self._sampled: tuple[np.ndarray, np.ndarray] | None = None
        self._lock = threading.Lock()
        """The diagnostics thread and the console's status line both sample."""
        self.tally = Tally()

    @property
    def distance(self) -> bool:
        return self._target is not None and (self._object is not None or self._point is not None)

    def sample(self) -> dict[str, str]:
        """The figures of the newest RUN tick, as /diagnostics values (`figure.<name>`); a tick not
        sampled before also counts toward the run's tally."""
        with self._lock:
            try:
                return self._sample()
            except Exception as err:  # a figure must never cost the operator the shield's report
                return {"figure.error": f"{type(err).__name__}: {err}"[:200]}

    def _sample(self) -> dict[str, str]:
        latest = self.latest
        if latest is None:
            return {}
        fresh, self._sampled = latest is not self._sampled, latest
        obs, q = latest[0].reshape(-1), latest[1]
        tally, values = self.tally, {}
        tally.samples += fresh
        if self._gravity is not None:
            tilt = math.degrees(math.acos(min(1.0, max(-1.0, -float(obs[self._gravity][2])))))
            values["figure.tilt_deg"] = f"{tilt:.1f}"
            if fresh:
                tally.tilt_sum += tilt
                tally.tilt_max = max(tally.tilt_max, tilt)
                fallen = self.fall_tilt is not None and math.radians(tilt) > self.fall_tilt
                tally.falls += fallen and not tally.fallen
                tally.fallen = fallen
            values["figure.tilt_max_deg"] = f"{tally.tilt_max:.1f}"
            if self.fall_tilt is not None:
                values["figure.falls"] = str(tally.falls)
        if self._gyro is not None and self._velocity is not None:
            command, yaw_rate = obs[self._velocity], float(obs[self._gyro][2])
            error = abs(yaw_rate - float(command[2]))
            tally.yaw_error_sum += error if fresh else 0.0
            values |= {
                "figure.cmd_forward": f"{command[0]:.2f}",
                "figure.cmd_lateral": f"{command[1]:.2f}",
                "figure.cmd_yaw_rate": f"{command[2]:.2f}",
                "figure.yaw_rate": f"{yaw_rate:.2f}",
                "figure.yaw_rate_error_mean": f"{tally.yaw_error_sum / max(tally.samples, 1):.3f}",
            }
        if self.distance:
            distance = self._distance(obs, q)
            if fresh:
                tally.distance_min = min(tally.distance_min, distance)
                tally.within += self.within is not None and distance <= self.within
            values |= {"figure.distance_m": f"{distance:.3f}", "figure.distance_min_m": f"{tally.distance_min:.3f}"}
            if self.within is not None:
                values["figure.within_share"] = f"{tally.within / max(tally.samples, 1):.2f}"
        return values

    def _distance(self, obs: np.ndarray, q: np.ndarray) -> float:
        assert self._target is not None
        target = obs[self._target].astype(float)
        if self._object is not None:
            point = obs[self._object].astype(float)
        else:
            assert self._point is not None
            kinematics, rows = self._point
            point = kinematics(q[rows])
        return float(np.linalg.norm(point[: target.size] - target))

    def summary(self) -> str:
        """The run's figures in one line ('' before the first RUN sample), for the end of a deploy."""
        tally = self.tally
        if not tally.samples:
            return ""
        parts = [f"{tally.samples} samples in RUN"]
        if self._gravity is not None:
            parts.append(f"tilt mean {tally.tilt_sum / tally.samples:.1f} deg, max {tally.tilt_max:.1f} deg")
            if self.fall_tilt is not None:
                limit = math.degrees(self.fall_tilt)
                parts.append(f"{tally.falls} fall{'s' * (tally.falls != 1)} (tilt past {limit:.0f} deg)")
        if self._gyro is not None and self._velocity is not None:
            parts.append(f"yaw-rate error mean {tally.yaw_error_sum / tally.samples:.3f} rad/s")
        if self.distance:
            parts.append(f"distance to target min {tally.distance_min:.3f} m")
            if self.within is not None:
                parts.append(f"within {self.within:g} m in {tally.within} of {tally.samples} samples")
        return "figures: " + ", ".join(parts)


def figures_line(values: dict[str, str]) -> str:
    """The figures among /diagnostics values as one console line ('' when there are none)."""
    parts = []
    if "figure.tilt_deg" in values:
        parts.append(f"tilt {values['figure.tilt_deg']} deg (max {values.get('figure.tilt_max_deg', '?')})")
    if "figure.falls" in values:
        parts.append(f"falls {values['figure.falls']}")
    if "figure.yaw_rate" in values:
        parts.append(
            f"cmd {values['figure.cmd_forward']} m/s, {values['figure.cmd_lateral']} m/s, "
            f"{values['figure.cmd_yaw_rate']} rad/s; yaw rate {values['figure.yaw_rate']} rad/s "
            f"(mean error {values['figure.yaw_rate_error_mean']})"
        )
    if "figure.distance_m" in values:
        within = f", within share {values['figure.within_share']}" if "figure.within_share" in values else ""
        closest = values["figure.distance_min_m"]
        parts.append(f"distance to target {values['figure.distance_m']} m (min {closest}{within})")
    return "  ".join(parts)


def _angle(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= math.pi:
        raise BundleError(f"{where}: expected an angle in (0, pi] rad, got {brief(value)}")
    return float(value)


def _radius(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise BundleError(f"{where}: expected a finite distance > 0 (m), got {brief(value)}")
    return float(value)


def _point(point: Any, bundle_joints: list[str], load_model: Callable[[], Any], where: str):
    """The point's forward kinematics and the rows of the bundle's joints it reads."""
    if not isinstance(point, dict) or set(point) != _POINT_KEYS or point.get("kind") != "body_point":
        raise BundleError(f"{where}: expected a body_point {{kind, joints, body, offset}}, got {brief(point)}")
    joints, body, offset = point["joints"], point["body"], point["offset"]
    if not isinstance(joints, list) or not joints or not all(j in bundle_joints for j in joints):
        raise BundleError(f"{where}.joints: expected joints of the bundle's robot, got {brief(joints)}")
    if not isinstance(body, str) or not body:
        raise BundleError(f"{where}.body: expected a body name, got {brief(body)}")
    ok = isinstance(offset, list) and len(offset) == 3
    if not ok or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in offset):
        raise BundleError(f"{where}.offset: expected 3 finite numbers, got {brief(offset)}")
    from q2real.deploy_ros.observation import Kinematics

    rows = np.array([bundle_joints.index(j) for j in joints], dtype=np.intp)
    return Kinematics(load_model(), body, [float(v) for v in offset], joints, where), rows
