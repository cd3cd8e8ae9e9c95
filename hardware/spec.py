"""Robot specs: the one place where joint names, limits, default pose, gains and rates are written.

Sim, shield and deploy all read a `RobotSpec`; none of them repeats a number from it. A spec is a
YAML file beside its MJCF model (`hardware/<robot>/robot.yaml`). Loading validates every field and
raises `SpecError` naming the file and the field, because a wrong limit here reaches a real motor.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from q2real.configs.errors import Q2RealError

HARDWARE_DIR = Path(__file__).resolve().parent
ControlMode = Literal["torque", "position"]
CONTROL_MODES = ("torque", "position")
ROBOT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_TOP_KEYS = {"name", "model", "control_mode", "control_period", "joints", "imu", "payload"}
_IMU_KEYS = {"site", "rotation"}


JOINT_FACTS = ("position_limits", "velocity_limit", "effort_limit", "default_position", "kp", "kd", "stop_deceleration")
"""The per-joint fields besides the name, in `JointSpec` order."""
_JOINT_KEYS = {"name", *JOINT_FACTS}
MAX_STOP_TIME = 1.0
"""Longest a stop may take to bring a joint from its velocity limit to rest (s): a smaller
`stop_deceleration` would let a stopped robot coast on."""


class SpecError(Q2RealError, ValueError):
    """A robot spec is missing a field or holds a value the robot cannot have."""


@dataclass(frozen=True)
class JointSpec:
    """One actuated joint, in the order the policy sees it."""

    name: str
    position_limits: tuple[float, float]
    """Hard lower/upper position (rad or m); +-inf for a continuous joint."""
    velocity_limit: float
    """Largest |velocity| the joint may be commanded to reach (rad/s or m/s)."""
    effort_limit: float
    """Largest |torque| or |force| the actuator may apply (N m or N)."""
    default_position: float
    """Pose the robot holds when the policy outputs zero, and ramps to before running."""
    kp: float
    """PD stiffness for position control; 0 for torque-controlled joints."""
    kd: float
    """PD damping for position control; 0 for torque-controlled joints."""
    stop_deceleration: float = math.inf
    """Deceleration (rad/s^2 or m/s^2) at which a stop (HOLD, ESTOP) brings the commanded motion of a
    position-controlled joint to rest; inf (the default, the key left out): the target is latched at
    once. A drive whose controller refuses a jump in commanded velocity (Franka's joint position
    interface checks acceleration) needs its datasheet's value here."""


@dataclass(frozen=True)
class ImuSpec:
    """Where a floating-base robot's IMU sits: what turns its readings into the base-frame gravity and
    angular velocity the policy observed in simulation."""

    site: str
    """The MJCF site on the floating base whose frame is the IMU's frame."""
    rotation: tuple[float, float, float, float]
    """The IMU frame's orientation in the base body's frame, a unit quaternion (w, x, y, z); written
    into the model's site, so sim and deploy read the one mounting."""


@dataclass(frozen=True)
class RobotSpec:
    """Everything about a robot that sim, shield and deploy must agree on."""

    name: str
    model_path: Path
    control_mode: ControlMode
    control_period: float
    """Seconds between two policy actions on the real robot and in sim."""
    joints: tuple[JointSpec, ...]
    source: Path
    imu: ImuSpec | None = None
    """The base IMU of a legged or humanoid robot; None for a fixed-base robot."""
    payload: float | None = None
    """Rated payload (kg) at the link of the last joint (an arm's flange); the transfer gate loads the
    arm with it. A simulation fact: bundles do not carry it and the shield does not read it."""

    @property
    def joint_names(self) -> list[str]:
        return [j.name for j in self.joints]

    @property
    def num_joints(self) -> int:
        return len(self.joints)

    def array(self, field: str) -> np.ndarray:
        """One per-joint field as a float64 array in policy order (`position_limits` gives shape (n, 2))."""
        return np.array([getattr(j, field) for j in self.joints], dtype=np.float64)

    @property
    def rate_window(self) -> np.ndarray:
        """Per joint, the furthest a target may move in one control period (velocity limit x control
        period, float64): the shield's rate rule, the sim's clamps of it and stepped actions all use
        this one window, so a policy trained inside it is not cut on the robot."""
        return self.array("velocity_limit") * self.control_period

    @property
    def sha256(self) -> str:
        """Hash of the spec file and the model file: a bundle names the exact robot it was trained for."""
        digest = hashlib.sha256(self.source.read_bytes())
        digest.update(self.model_path.read_bytes())
        return digest.hexdigest()


def _number(value: Any, where: str, *, positive: bool = False, nonneg: bool = False, finite: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}: expected a number, got {value!r:.80}")
    try:
        value = float(value)
    except OverflowError:
        bits = int(value).bit_length()
        raise SpecError(f"{where}: expected a number that fits a float, got a {bits}-bit int") from None
    if math.isnan(value):
        raise SpecError(f"{where}: expected a number, got NaN")
    if positive and not (value > 0 and math.isfinite(value)):
        raise SpecError(f"{where}: expected a finite number > 0, got {value}")
    if nonneg and not (value >= 0 and math.isfinite(value)):
        raise SpecError(f"{where}: expected a finite number >= 0, got {value}")
    if finite and not math.isfinite(value):
        raise SpecError(f"{where}: expected a finite number, got {value}")
    return value


def _require(data: dict, key: str, where: str) -> Any:
    if key not in data:
        raise SpecError(f"{where}: missing required field '{key}'")
    return data[key]


def _check_keys(data: Any, allowed: set[str], where: str) -> None:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")


Locate = Callable[[str, int | None, str], str]
"""(field, joint index or None, joint name) -> where an error points, in the words of the file that
holds the robot: `robot.yaml: joints[2](elbow).kp` for a spec, `metadata.robot.kp[2]` for a bundle."""


def check_robot_name(name: Any, where: str) -> str:
    """A robot name is a folder name under `hardware/`, never a path."""
    if not isinstance(name, str) or not ROBOT_NAME.fullmatch(name) or name in (".", ".."):
        raise SpecError(
            f"{where}: expected a robot name of letters, digits, '_', '-' or '.' (at most 64, not a path), "
            f"got {name!r:.80}"
        )
    return name


def _joint(data: dict[str, Any], i: int, control_mode: str, locate: Locate) -> JointSpec:
    name = data.get("name")
    if not isinstance(name, str) or not name or len(name) > 256 or not name.isprintable() or name != name.strip():
        raise SpecError(f"{locate('name', i, '?')}: expected a non-empty printable joint name, got {name!r:.80}")
    where = lambda key: locate(key, i, name)  # noqa: E731
    limits = _require(data, "position_limits", where(""))
    if not isinstance(limits, list | tuple) or len(limits) != 2:
        raise SpecError(f"{where('position_limits')}: expected [lower, upper], got {limits!r}")
    lo = _number(limits[0], f"{where('position_limits')}[0]")
    hi = _number(limits[1], f"{where('position_limits')}[1]")
    if not lo < hi or lo == math.inf or hi == -math.inf:
        raise SpecError(f"{where('position_limits')}: lower {lo} must be below upper {hi}")
    default = _number(_require(data, "default_position", where("")), where("default_position"), finite=True)
    if not lo <= default <= hi:
        raise SpecError(f"{where('default_position')}: {default} lies outside position_limits [{lo}, {hi}]")
    kp = _number(data.get("kp", 0.0), where("kp"), nonneg=True)
    kd = _number(data.get("kd", 0.0), where("kd"), nonneg=True)
    if control_mode == "position" and kp <= 0:
        raise SpecError(f"{where('kp')}: position-controlled joints need kp > 0, got {kp}")
    velocity = _require(data, "velocity_limit", where(""))
    effort = _require(data, "effort_limit", where(""))
    stop = _number(data.get("stop_deceleration", math.inf), where("stop_deceleration"))
    if not stop > 0:
        raise SpecError(f"{where('stop_deceleration')}: expected a number > 0 (inf: stop at once), got {stop}")
    speed = _number(velocity, where("velocity_limit"), positive=True)
    if speed / stop > MAX_STOP_TIME:
        raise SpecError(
            f"{where('stop_deceleration')}: {stop:g} takes {speed / stop:.3g} s to stop the joint from its velocity "
            f"limit {speed:g}; a stop may take at most {MAX_STOP_TIME:g} s (expected >= {speed / MAX_STOP_TIME:g})"
        )
    return JointSpec(
        name=name,
        position_limits=(lo, hi),
        velocity_limit=speed,
        effort_limit=_number(effort, where("effort_limit"), positive=True),
        default_position=default,
        kp=kp,
        kd=kd,
        stop_deceleration=stop,
    )


def _imu(data: Any, where: str) -> ImuSpec | None:
    if data is None:
        return None
    _check_keys(data, _IMU_KEYS, where)
    site = _require(data, "site", where)
    if not isinstance(site, str) or not site or len(site) > 256 or not site.isprintable():
        raise SpecError(f"{where}.site: expected a site name, got {site!r:.80}")
    rotation = _require(data, "rotation", where)
    if not isinstance(rotation, list | tuple) or len(rotation) != 4:
        raise SpecError(f"{where}.rotation: expected a quaternion [w, x, y, z], got {rotation!r:.80}")
    quat = [_number(v, f"{where}.rotation[{i}]", finite=True) for i, v in enumerate(rotation)]
    norm = math.sqrt(sum(v * v for v in quat))
    if abs(norm - 1.0) > 1e-3:
        raise SpecError(f"{where}.rotation: expected a unit quaternion, got norm {norm:.6g}")
    w, x, y, z = (v / norm for v in quat)
    return ImuSpec(site, (w, x, y, z))


def build_spec(
    name: Any,
    control_mode: Any,
    control_period: Any,
    joints: Any,
    locate: Locate,
    model_path: Path,
    source: Path,
    imu: Any = None,
) -> RobotSpec:
    """The one validator of robot facts, for a spec file and for a bundle's robot section alike.

    Each joint is a mapping with the `JointSpec` field names. Every rule that keeps the shield's
    windows meaningful is here: positive finite velocity and effort limits, ordered position limits,
    a finite default pose inside them, non-negative gains (kp > 0 under position control), unique
    joint names, a control mode from the closed set and an IMU mounting that is a rotation.
    """
    check_robot_name(name, locate("name", None, ""))
    if control_mode not in CONTROL_MODES:
        where = locate("control_mode", None, "")
        raise SpecError(f"{where}: expected 'torque' or 'position', got {control_mode!r:.80}")
    period = _number(control_period, locate("control_period", None, ""), positive=True)
    if period > 1.0:
        raise SpecError(f"{locate('control_period', None, '')}: {period} s; feedback control needs at most 1 s")
    if not isinstance(joints, list | tuple) or not joints:
        raise SpecError(f"{locate('joints', None, '')}: expected a non-empty list of joints")
    specs = tuple(_joint(j, i, control_mode, locate) for i, j in enumerate(joints))
    names = [j.name for j in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SpecError(f"{locate('joints', None, '')}: duplicate joint name(s) {dupes!r:.200}")
    return RobotSpec(name, model_path, control_mode, period, specs, source, _imu(imu, locate("imu", None, "")))


def differences(a: RobotSpec, b: RobotSpec) -> list[str]:
    """Field-by-field differences between two descriptions of a robot, as 'field: a vs b' lines."""
    found = [
        f"{key}: {getattr(a, key)!r} vs {getattr(b, key)!r}"
        for key in ("name", "control_mode", "control_period")
        if getattr(a, key) != getattr(b, key)
    ]
    if a.imu != b.imu:
        found.append(f"imu: {a.imu} vs {b.imu}")
    if a.joint_names != b.joint_names:
        return [*found, f"joint_names: {a.joint_names!r:.200} vs {b.joint_names!r:.200}"]
    for ja, jb in zip(a.joints, b.joints, strict=True):
        for key in JOINT_FACTS:
            if getattr(ja, key) != getattr(jb, key):
                found.append(f"joints.{ja.name}.{key}: {getattr(ja, key)} vs {getattr(jb, key)}")
    return found


def tighter(trained: RobotSpec, local: RobotSpec) -> RobotSpec:
    """The robot both descriptions allow: the narrower position window and the lower velocity and
    effort limits per joint, with this machine's default pose, gains and stop deceleration; for running a policy on a
    robot whose spec differs from the one it was trained with. Joints and control mode must agree."""
    if trained.joint_names != local.joint_names or trained.control_mode != local.control_mode:
        raise SpecError(
            f"{local.source}: joints or control mode differ from the bundle's robot "
            f"({trained.joint_names!r:.200} {trained.control_mode} vs {local.joint_names!r:.200} "
            f"{local.control_mode}); no override runs a policy on other joints"
        )
    joints = []
    for a, b in zip(trained.joints, local.joints, strict=True):
        lo, hi = max(a.position_limits[0], b.position_limits[0]), min(a.position_limits[1], b.position_limits[1])
        if not lo <= b.default_position <= hi:
            raise SpecError(
                f"{local.source}: joints.{b.name}: the default pose {b.default_position} lies outside the position "
                f"window both robots allow [{lo}, {hi}]"
            )
        velocity, effort = min(a.velocity_limit, b.velocity_limit), min(a.effort_limit, b.effort_limit)
        joints.append(dataclasses.replace(b, position_limits=(lo, hi), velocity_limit=velocity, effort_limit=effort))
    return dataclasses.replace(local, control_period=trained.control_period, joints=tuple(joints))


def load_spec(path: str | Path) -> RobotSpec:
    """Read and validate a robot spec YAML; every error names the file and the field."""
    path = Path(path).resolve()
    if not path.is_file():
        raise SpecError(f"{path}: robot spec file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from err
    where = str(path)
    _check_keys(data, _TOP_KEYS, where)
    for i, joint in enumerate(data["joints"] if isinstance(data.get("joints"), list) else []):
        _check_keys(joint, _JOINT_KEYS, f"{where}: joints[{i}]")
    model_rel = _require(data, "model", where)
    if not isinstance(model_rel, str):
        raise SpecError(f"{where}: model: expected a path relative to the spec, got {model_rel!r}")
    model_path = (path.parent / model_rel).resolve()
    if not model_path.is_file():
        raise SpecError(f"{where}: model: file {model_path} not found")

    def locate(key: str, i: int | None, joint: str) -> str:
        if i is None:
            return f"{where}: {key}"
        if key == "name":
            return f"{where}: joints[{i}].name"
        return f"{where}: joints[{i}]({joint})" + (f".{key}" if key else "")

    spec = build_spec(
        _require(data, "name", where),
        _require(data, "control_mode", where),
        _require(data, "control_period", where),
        _require(data, "joints", where),
        locate,
        model_path,
        path,
        data.get("imu"),
    )
    if data.get("payload") is None:
        return spec
    return dataclasses.replace(spec, payload=_number(data["payload"], f"{where}: payload", positive=True))


def robot_spec(name: str) -> RobotSpec:
    """The spec shipped in `hardware/<name>/robot.yaml`."""
    check_robot_name(name, "robot")
    path = HARDWARE_DIR / name / "robot.yaml"
    if not path.is_file():
        shipped = sorted(p.parent.name for p in HARDWARE_DIR.glob("*/robot.yaml"))
        raise SpecError(f"{path}: no robot spec named '{name}'; shipped specs: {shipped}")
    return load_spec(path)
