"""Observations on the robot, assembled from the node's inputs exactly as the task computed them in sim.

Each observation term in a bundle's metadata names its `source`: what it is made of on the robot.
The vocabulary is small and closed, so a bundle either says precisely how to build its observation
or is refused before the robot moves:

  joint_position           q of the listed joints, minus `offset` if given (e.g. the default pose)
  joint_velocity           q dot of the listed joints
  joint_position_cos_sin   cos q of the listed joints, then sin q (angles without the wrap at +-pi)
  last_action              the policy's previous output in [-1, 1] (zeros before the first)
  action_history           its outputs of the ticks before that, newest first (dim: a multiple of the
                           action's), zeros where there were none: with `last_action`, the actions an
                           actuator chain with a few ticks of latency has yet to carry out
  command                  the task command (e.g. a target), from the command input; `ranges` (one
                           [lower, upper] per value, the box training drew commands from) bounds
                           what the node takes
  projected_gravity        unit gravity in the base frame, from the IMU's orientation
  base_angular_velocity    the base's angular velocity in the base frame, from the IMU's gyro
  velocity_command         (forward, lateral, yaw rate) from a Twist, clipped to `ranges`
  object_position          a tracked object's position in `frame_id`, from a PoseStamped
  body_point               the position of a point `offset` fixed to `body`, by forward kinematics of
                           the listed joints in this machine's robot model (fixed-base robots)

The IMU terms turn the IMU's readings into the base frame with the mounting rotation of the robot
spec (`q2real.deploy_ros.inputs`). The tests feed simulator states through the ROS messages the sim
robot publishes and this builder, and require the task's own observation, so the sim and robot
sides cannot drift apart silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from q2real.contracts.schema import BundleError, brief

JOINT_KINDS = ("joint_position", "joint_velocity", "joint_position_cos_sin", "body_point")
STREAMS = {
    "last_action": "last_action",
    "action_history": "last_action",
    "command": "command",
    "projected_gravity": "imu",
    "base_angular_velocity": "imu",
    "velocity_command": "velocity_command",
    "object_position": "object_pose",
}
"""Kind -> the node input it reads, for every term that is not made of joint states."""
KINDS = (*JOINT_KINDS, *STREAMS)
SOURCE_KEYS = {
    "joint_position": {"joints", "offset"},
    "joint_velocity": {"joints"},
    "joint_position_cos_sin": {"joints"},
    "body_point": {"joints", "body", "offset"},
    "command": {"ranges"},
    "velocity_command": {"ranges"},
    "object_position": {"frame_id"},
}
"""Keys a source may carry besides `kind`; any other key is an error, not ignored."""
_FIXED_DIM = {"projected_gravity": 3, "base_angular_velocity": 3, "velocity_command": 3, "object_position": 3}
UNRANGED_COMMAND_LIMIT = 100.0
"""Largest magnitude a command value may have when the bundle gives no range for it (bundles written
before command terms carried `ranges`): beyond every command a q2real task draws (m, m/s, rad/s), and
far inside float32, so a value that would overflow the observation never reaches the policy."""
VELOCITY_COMMAND_NAMES = ("forward", "lateral", "yaw rate")
"""The velocity command's values, in the order a `velocity_command` term's `ranges` gives them."""


@dataclass(frozen=True)
class _Term:
    name: str
    kind: str
    start: int
    dim: int
    index: np.ndarray
    offset: np.ndarray | None = None


_PLANNED = ("joint_position", "joint_velocity", "joint_position_cos_sin")
"""Joint terms built by one compiled call; the rest (inputs, forward kinematics) term by term."""


@dataclass(frozen=True)
class _JointPlan:
    """The joint terms as flat arrays for `_joint_terms`: kind code, first output slot and joint count
    per term; the joints' indices (and position offsets, zero where none) of all terms end to end."""

    kinds: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    first: np.ndarray
    index: np.ndarray
    offset: np.ndarray

    @staticmethod
    def of(terms: list[_Term]) -> _JointPlan:
        ints = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
        counts = [len(t.index) for t in terms]
        return _JointPlan(
            kinds=ints([_PLANNED.index(t.kind) for t in terms]),
            starts=ints([t.start for t in terms]),
            counts=ints(counts),
            first=ints(np.cumsum([0, *counts])[:-1]),
            index=ints([j for t in terms for j in t.index]),
            offset=np.asarray(
                [v for t in terms for v in (t.offset if t.offset is not None else np.zeros(len(t.index)))],
                dtype=np.float64,
            ),
        )


@njit(cache=True, nogil=True)
def _joint_terms(position, velocity, out, kinds, starts, counts, index, first, offset) -> None:
    """Every joint term in one call: q (minus its offset), q dot, or cos q then sin q, into `out`."""
    for t in range(kinds.size):
        start, n, f, kind = starts[t], counts[t], first[t], kinds[t]
        for i in range(n):
            j = index[f + i]
            if kind == 0:
                out[start + i] = position[j] - offset[f + i]
            elif kind == 1:
                out[start + i] = velocity[j]
            else:
                out[start + i] = np.cos(position[j])
                out[start + n + i] = np.sin(position[j])


class Kinematics:
    """World position of a point fixed to a body of the robot's own model, from joint positions."""

    def __init__(self, model, body: str, offset: list[float], joints: list[str], where: str):
        import mujoco  # only bundles that observe a body point need the model on the robot

        if any(model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE for j in range(model.njnt)):
            raise BundleError(f"{where}: a body point needs a fixed-base robot (its base pose is not measured)")
        self._mujoco, self.model, self.data = mujoco, model, mujoco.MjData(model)
        self.body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body)
        if self.body < 0:
            raise BundleError(f"{where}: source.body: no body {brief(body)} in this machine's robot model")
        ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in joints]
        if min(ids) < 0:
            raise BundleError(f"{where}: source.joints: {brief(joints)} are not all joints of the robot model")
        self.qpos = np.array([model.jnt_qposadr[j] for j in ids])
        self.offset = np.asarray(offset, dtype=float)

    def __call__(self, position: np.ndarray) -> np.ndarray:
        self.data.qpos[self.qpos] = position
        self._mujoco.mj_kinematics(self.model, self.data)
        return self.data.xpos[self.body] + self.data.xmat[self.body].reshape(3, 3) @ self.offset


def _numbers(value, length: int, where: str) -> list[float]:
    ok = isinstance(value, list) and len(value) == length
    ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    if not ok:
        raise BundleError(f"{where}: expected {length} finite numbers, got {brief(value)}")
    return [float(v) for v in value]


def _command_ranges(ranges, dim: int, where: str) -> list[list[float]]:
    """A command term's `ranges`: one finite [lower, upper] pair, lower <= upper, per value."""
    rows = ranges if isinstance(ranges, list) and len(ranges) == dim else None
    bounds = [_numbers(r, 2, f"{where}: source.ranges[{k}]") for k, r in enumerate(rows or [])]
    if rows is None or not all(lo <= hi for lo, hi in bounds):
        raise BundleError(f"{where}: source.ranges: expected {dim} [lower, upper] pairs, got {brief(ranges)}")
    return bounds


class ObservationBuilder:
    """Fills one float32 (1, obs_dim) buffer per tick from joint states in the builder's joint order
    and the latest value of each input stream the bundle reads.

    `load_model`: compiles this machine's MuJoCo model of the robot; called only for `body_point` terms.
    """

    def __init__(self, metadata: dict, source: str, load_model: Callable[[], Any] | None = None):
        terms = metadata["observation"]["terms"]
        self.dim = metadata["observation"]["dim"]
        self.action_dim = metadata["action"]["dim"]
        joints: list[str] = []
        parsed = []
        start = 0
        self.command_dim = 0
        command_ranges: list[list[float]] = []
        self.command_names: list[str] = []
        """Each command value's name: its term's, indexed when the term has more than one."""
        self._command_ranged: list[bool] = []
        """Per command value, whether its bound is the bundle's range or `UNRANGED_COMMAND_LIMIT`."""
        self.velocity_ranges: np.ndarray | None = None
        """(3, 2) lower/upper bounds of the velocity command, if the bundle reads one."""
        self.object_frame: str | None = None
        """The frame a tracked object's pose must be given in, if the bundle reads one."""
        self._kinematics: dict[int, Kinematics] = {}
        model = None
        for i, term in enumerate(terms):
            where = f"{source}: metadata.observation.terms[{i}] ({brief(term['name'])})"
            spec = term.get("source")
            if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
                raise BundleError(
                    f"{where}: source: expected {{'kind': one of {list(KINDS)}, ...}}, got {brief(spec)}; "
                    "this bundle does not say how to build its observation on a robot"
                )
            kind, dim = spec["kind"], term["dim"]
            unknown = sorted(set(spec) - {"kind"} - SOURCE_KEYS.get(kind, set()))
            if unknown:
                raise BundleError(f"{where}: source: unknown key(s) {brief(unknown)} for a '{kind}' term")
            names = spec.get("joints", [])
            offset = None
            if kind in JOINT_KINDS:
                if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
                    raise BundleError(f"{where}: source.joints: expected a list of joint names")
                repeated = sorted({n for n in names if names.count(n) > 1})
                if repeated:
                    raise BundleError(f"{where}: source.joints: {brief(repeated)} listed more than once")
                expected = {"joint_position_cos_sin": 2 * len(names), "body_point": 3}.get(kind, len(names))
            elif kind == "last_action":
                expected = self.action_dim
            elif kind == "action_history":
                whole = dim > 0 and dim % self.action_dim == 0
                expected = dim if whole else f"a positive multiple of {self.action_dim}"
            else:
                expected = _FIXED_DIM.get(kind, dim)
            if dim != expected:
                raise BundleError(f"{where}: dim {dim} disagrees with its source (expected {expected})")
            for name in names:
                if name not in joints:
                    joints.append(name)
            if kind == "command":
                index = list(range(self.command_dim, self.command_dim + dim))
                self.command_dim += dim
                self.command_names += [term["name"]] if dim == 1 else [f"{term['name']}[{k}]" for k in range(dim)]
                ranges = spec.get("ranges")
                self._command_ranged += [ranges is not None] * dim
                limit = [-UNRANGED_COMMAND_LIMIT, UNRANGED_COMMAND_LIMIT]
                command_ranges += [limit] * dim if ranges is None else _command_ranges(ranges, dim, where)
            else:
                index = [joints.index(n) for n in names]
            if kind == "joint_position" and "offset" in spec:
                offset = np.asarray(_numbers(spec["offset"], len(names), f"{where}: source.offset"))
            elif kind == "body_point":
                if load_model is None:
                    raise BundleError(f"{where}: a body point needs this machine's robot model for forward kinematics")
                model = model or load_model()
                point = _numbers(spec.get("offset"), 3, f"{where}: source.offset")
                body = spec.get("body")
                if not isinstance(body, str) or not body:
                    raise BundleError(f"{where}: source.body: expected a body name, got {brief(body)}")
                self._kinematics[i] = Kinematics(model, body, point, names, where)
            elif kind == "velocity_command":
                self._velocity_ranges(spec.get("ranges"), where)
            elif kind == "object_position":
                frame = spec.get("frame_id")
                if not isinstance(frame, str) or not frame or self.object_frame is not None:
                    raise BundleError(
                        f"{where}: source.frame_id: expected the frame name of one tracked object, got {brief(frame)}"
                    )
                self.object_frame = frame
            parsed.append(_Term(term["name"], kind, start, dim, np.asarray(index, dtype=np.intp), offset))
            start += dim
        self.spans = {t.kind: slice(t.start, t.start + t.dim) for t in reversed(parsed)}
        """Where in the observation each source kind's first term lies: what the task figures read."""
        self.command_ranges = np.asarray(command_ranges, dtype=float).reshape(-1, 2)
        """(command_dim, 2) lower/upper bounds of each command value the node takes."""
        self.joints = tuple(joints)
        """Every joint the observation reads, actuated or not (e.g. a passive pole's encoder)."""
        self.history_ticks = max((t.dim // self.action_dim for t in parsed if t.kind == "action_history"), default=0)
        """How many outputs before the previous one the node keeps for the `action_history` terms."""
        self.streams = frozenset(STREAMS[t.kind] for t in parsed if t.kind in STREAMS) - {"last_action"}
        """The input streams besides joint states this bundle reads: 'command', 'imu', ..."""
        self.buffer = np.zeros((1, self.dim), dtype=np.float32)
        self._joint_plan = _JointPlan.of([t for t in parsed if t.kind in _PLANNED])
        self._other_terms = [(i, t) for i, t in enumerate(parsed) if t.kind not in _PLANNED]
        """The terms read from inputs or forward kinematics, with their term numbers; a command term's
        `index` holds its positions in the command vector."""
        plan, zeros = self._joint_plan, np.zeros(len(self.joints))
        # Compiled (or loaded from numba's cache) here, for the arrays a tick passes, not on the first tick.
        _joint_terms(
            zeros, zeros, self.buffer[0], plan.kinds, plan.starts, plan.counts, plan.index, plan.first, plan.offset
        )
        self.buffer[:] = 0.0

    def _velocity_ranges(self, ranges, where: str) -> None:
        if self.velocity_ranges is not None:
            raise BundleError(f"{where}: a second velocity command term; the node reads one cmd_vel")
        rows = ranges if isinstance(ranges, list) and len(ranges) == 3 else None
        bounds = [_numbers(r, 2, f"{where}: source.ranges[{k}]") for k, r in enumerate(rows or [])]
        if rows is None or not all(lo <= 0.0 <= hi for lo, hi in bounds):
            raise BundleError(
                f"{where}: source.ranges: expected 3 [lower, upper] pairs around 0 (forward, lateral, yaw rate; "
                f"a timed-out command is zero), got {brief(ranges)}"
            )
        self.velocity_ranges = np.asarray(bounds)

    def command_refusal(self, values: np.ndarray) -> str | None:
        """Why a command (all command terms' values, in term order) is not one the policy was trained
        on, naming the first value out of its range; None when every value is in range."""
        low, high = self.command_ranges[:, 0], self.command_ranges[:, 1]
        outside = np.flatnonzero(~((low <= values) & (values <= high)))  # NaN is outside too
        if not outside.size:
            return None
        i = int(outside[0])
        name, value = self.command_names[i], float(values[i])
        if self._command_ranged[i]:
            expected = f"within [{low[i]:g}, {high[i]:g}], the range the policy was trained on"
        else:
            expected = (
                f"within +-{UNRANGED_COMMAND_LIMIT:g} (the bundle gives no range for it; re-export it to "
                "check commands against the task's own range)"
            )
        return f"{name} (value {i}) = {value!r}: expected {expected}"

    def __call__(self, position: np.ndarray, velocity: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The observation for joint states in `self.joints` order and the latest input values by kind
        ('last_action', 'action_history' as long as the longest such term, 'command' with all command terms
        concatenated in term order, 'projected_gravity', ...); returns the (reused) buffer."""
        out = self.buffer[0]
        plan = self._joint_plan
        _joint_terms(position, velocity, out, plan.kinds, plan.starts, plan.counts, plan.index, plan.first, plan.offset)
        for i, term in self._other_terms:
            span = slice(term.start, term.start + term.dim)
            kind = term.kind
            if kind == "body_point":
                out[span] = self._kinematics[i](position[term.index])
            else:
                value = inputs.get(kind)
                if value is None:
                    raise ValueError(f"observation term '{term.name}' needs a '{kind}' input and none was given")
                out[span] = value[term.index] if kind == "command" else value[: term.dim]
        return self.buffer
