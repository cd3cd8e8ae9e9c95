"""The safety shield: every control tick, turn (joint state, policy action) into a command that is
finite and within the robot's position, velocity and effort limits, whatever the inputs were.

Order of one tick (each rule sets its bit in `Command.flags` when it acts):
  1. state validity   all spec joints present (matched by name, any order), finite, within the hard
                      limits + tolerance (beyond: ESTOP), fresh; otherwise the last valid state is used
                      and, once none is fresher than `max_state_age`, RUN falls back to HOLD/DAMP
  2. policy output    missing or late (deadline miss) or non-finite or misshaped -> the previous
                      target is held for this tick and never forwarded; N in a row -> HOLD/DAMP
  3. learned veto     an optional veto may replace the action with the fallback (hold) before any clamp
  4. clip + map       a in [-clip, clip]; q* = offset + scale a (position control) or tau = scale a (torque)
  5. soft limits      q* inside the soft position window (hard limits shrunk by `soft_limit_margin`)
  6. rate             |q* - previous q*| <= v_max dt, referenced to the previous command (ros2_control)
  7. workspace        optional: if forward kinematics of q* puts a named site/body outside its box, the
                      previous target is held instead
  8. effort           |kp (q* - q) - kd qd| <= tau_max by moving q* toward q within the rate and hard
                      position windows, and only if that is not enough, by scaling kp and kd down
The deterministic rules 4-8 always run last, so no veto, policy or sensor value can bypass them.

Stopping (HOLD, and ESTOP with the hold fallback, under position control) replaces rules 4-8 for the
target: the commanded motion, as the last tick's target step, is brought to rest at the spec's
`stop_deceleration` (at once by default) and the target then stays latched. It never reads the
measured state: a stiff drive follows its targets, so a target that moves with the measured motion
(the effort window centres on q + kd qd / kp) would keep a moving robot moving for as long as the stop
lasts. The effort limit is then kept by scaling the gains alone. Commanded travel after a stop is at
most v^2 / (2 stop_deceleration) per joint (v the commanded speed, at most the velocity limit), and
the commanded speed is zero within v / stop_deceleration; at once, both are zero.

Modes: PASSIVE -> RAMP (measured pose to default pose over `ramp_time`; refused if too far) -> RUN ->
HOLD (arms) or DAMP (legged) -> ESTOP (latched). Escalation is automatic; de-escalation (`reset`) is the
operator's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal

import numpy as np

from q2real.configs import checks
from q2real.hardware import RobotSpec
from q2real.hardware.action import action_mapping, command_from_action
from q2real.safety.flags import CLAMPS, Mode, Rule
from q2real.safety.limits import clip, gain_scale, outward_effort_zeroed

# Plain ints in the per-tick path: IntFlag arithmetic costs microseconds per operation.
R = SimpleNamespace(**{str(rule.name): int(rule) for rule in Rule})
_BITS = [(str(rule.name), int(rule)) for rule in Rule]
_CLAMPS = int(CLAMPS)

Veto = Callable[[np.ndarray, np.ndarray, np.ndarray], bool]
"""veto(q, qd, action) -> True when the action is unsafe and must be replaced by the fallback."""


@dataclass
class ShieldConfig:
    fallback: Literal["hold", "damp"] | None = None
    """What RUN drops to on its own: a stiff hold (arms) or damping with kp = 0 (legged robots: never
    stiff while falling); None: damp for a floating-base robot (its spec names a base IMU), else hold."""
    action_clip: float = 1.0
    """Policy actions are clipped to [-action_clip, action_clip] (at most 1) before they become commands."""
    action_scale: tuple[float, ...] | None = None
    """Per joint; None maps [-1, 1] as q2real's tasks do (torque: effort limit; position: to the limits)."""
    action_offset: tuple[float, ...] | None = None
    """Per joint; None means the default pose (position control) or zero torque."""
    soft_limit_margin: float = 0.05
    """Fraction of each bounded joint's range kept free inside the hard limits."""
    position_tolerance: float = 0.05
    """How far (rad or m) a measured position may lie beyond a hard limit before it is a fault."""
    velocity_fault_factor: float = 10.0
    """A measured |velocity| above this many times the joint's velocity limit is a sensor fault (ESTOP)."""
    max_state_age: float = 0.1
    """Seconds without a valid, fresh joint state before RUN falls back."""
    deadline: float | None = None
    """Seconds the policy may take; None means half the control period."""
    max_deadline_misses: int = 3
    """Policy outputs in a row that are missing or later than `deadline` before RUN falls back; each
    one holds the previous target for its tick."""
    max_bad_actions: int = 3
    """Non-finite or misshaped policy outputs in a row before RUN falls back; each one is dropped and the
    previous target held."""
    ramp_time: float = 2.0
    """Seconds RAMP takes to move the robot from its measured pose to the default pose, before the policy
    takes over."""
    ramp_max_distance: float = 1.0
    """Largest |measured - default| (rad or m) from which RAMP may start; on a torque robot a continuous
    joint's the nearest way round (its ramp moves nothing, and its angle counts whole turns)."""
    damp_kd: float = 1.0
    """Damping for DAMP (and for joints whose spec has kd = 0)."""
    workspace_points: tuple[str, ...] = ()
    """MJCF sites or bodies (e.g. the end effector) that must stay inside the workspace box; empty = off."""
    workspace_lower: tuple[float, float, float] = (-math.inf, -math.inf, -math.inf)
    """Lower corner (m, the robot model's world frame) of the box the `workspace_points` must stay in:
    a target that puts one outside is replaced by the previous target."""
    workspace_upper: tuple[float, float, float] = (math.inf, math.inf, math.inf)
    """Upper corner (m) of that box."""

    def validate(self) -> None:
        """Every value finite and of the sign its rule needs: a NaN margin or a negative damping gain
        would disarm the rule it configures."""
        if self.fallback not in (None, "hold", "damp"):
            raise ValueError(f"fallback: expected 'hold' or 'damp', got {self.fallback!r:.80}")
        checks.number("action_clip", self.action_clip, above=0.0, at_most=1.0)
        if self.action_scale is not None:
            checks.numbers("action_scale", self.action_scale, at_least=0.0)
        if self.action_offset is not None:
            checks.numbers("action_offset", self.action_offset)
        checks.number("soft_limit_margin", self.soft_limit_margin, at_least=0.0, below=0.5)
        # Upper bounds too: a tolerance of a kilometre or a state age of an hour switches a rule off.
        checks.number("position_tolerance", self.position_tolerance, at_least=0.0, at_most=0.5)
        checks.number("velocity_fault_factor", self.velocity_fault_factor, at_least=1.0, at_most=100.0)
        checks.number("max_state_age", self.max_state_age, above=0.0, at_most=1.0)
        if self.deadline is not None:
            checks.number("deadline", self.deadline, above=0.0)
        checks.number("max_deadline_misses", self.max_deadline_misses, at_least=1, at_most=1000)
        checks.number("max_bad_actions", self.max_bad_actions, at_least=1, at_most=1000)
        checks.number("ramp_time", self.ramp_time, at_least=0.0, at_most=60.0)
        if self.ramp_max_distance != math.inf:  # inf: ramp from anywhere (simulation only)
            checks.number("ramp_max_distance", self.ramp_max_distance, above=0.0)
        checks.number("damp_kd", self.damp_kd, at_least=0.0)
        checks.names("workspace_points", self.workspace_points)
        for i, (lo, hi) in enumerate(zip(self.workspace_lower, self.workspace_upper, strict=True)):
            if math.isnan(lo) or math.isnan(hi) or not lo <= hi:
                raise ValueError(f"workspace_lower[{i}]/workspace_upper[{i}]: expected lower <= upper, got {lo}, {hi}")


@dataclass
class Command:
    """What to send to the joints: PD targets and gains plus feed-forward effort, in spec order."""

    mode: Mode
    position: np.ndarray
    kp: np.ndarray
    kd: np.ndarray
    effort: np.ndarray
    flags: Rule
    reason: str = ""
    """Set on the tick the mode changed: why."""


RULE_NAMES = [str(rule.name) for rule in Rule]
"""Rule i is bit i (`Rule`): its count lives in `Counters.counts[i]`."""
TICKS, RUN_TICKS, RUN_INTERVENTIONS = len(RULE_NAMES), len(RULE_NAMES) + 1, len(RULE_NAMES) + 2


class Counters:
    """What the shield did, held in two arrays so that the compiled shield counts in place."""

    def __init__(self) -> None:
        self.counts = np.zeros(len(RULE_NAMES) + 3, dtype=np.int64)
        """Ticks on which each rule acted (index = bit), then ticks, RUN ticks and RUN interventions."""
        self.change = np.zeros(1)
        """`run_change`, as a one-element array."""

    @property
    def rules(self) -> dict[str, int]:
        return {name: int(self.counts[i]) for i, name in enumerate(RULE_NAMES)}

    @property
    def ticks(self) -> int:
        return int(self.counts[TICKS])

    @property
    def run_ticks(self) -> int:
        """Ticks in RUN: the policy's own."""
        return int(self.counts[RUN_TICKS])

    @property
    def run_interventions(self) -> int:
        """RUN ticks on which a clamp (`CLAMPS`) changed the policy's command: over `run_ticks`, how often
        the shield overrides the policy, with neither the ramp's nor a fallback's ticks in the count."""
        return int(self.counts[RUN_INTERVENTIONS])

    @property
    def run_change(self) -> float:
        """Sum over RUN ticks of how far the clamps moved the command (mean over joints, in action units,
        from the unclipped action): over `run_ticks`, how hard the policy presses against the rules, which
        a count cannot tell once some joint is clamped on every tick."""
        return float(self.change[0])

    def count(self, rule: Rule) -> None:
        """One more tick on which `rule` acted outside a tick (a refused ramp)."""
        self.counts[int(rule).bit_length() - 1] += 1

    def add(self, flags: int, mode: Mode, change: float) -> None:
        self.counts[TICKS] += 1
        if mode == Mode.RUN:
            self.counts[RUN_TICKS] += 1
            self.counts[RUN_INTERVENTIONS] += bool(flags & _CLAMPS)
            self.change[0] += change
        if flags:
            for i, (_, bit) in enumerate(_BITS):
                if flags & bit:
                    self.counts[i] += 1


class Workspace:
    """Forward kinematics of the robot's own MJCF (`mj_kinematics` on a private MjData) to keep named
    sites or bodies inside an axis-aligned box."""

    def __init__(self, spec: RobotSpec, config: ShieldConfig):
        import mujoco  # only a shield with a workspace box needs MuJoCo

        from q2real.hardware.model import load_model

        self._mujoco = mujoco
        self.model = load_model(spec)
        self.data = mujoco.MjData(self.model)
        self.qpos_index = [
            int(self.model.jnt_qposadr[mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, n)])
            for n in spec.joint_names
        ]
        self.points = []
        for name in config.workspace_points:
            site = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, name)
            body = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, name)
            if site < 0 and body < 0:
                raise ValueError(f"shield.workspace_points: '{name}' is neither a site nor a body of {spec.model_path}")
            self.points.append(("site", site) if site >= 0 else ("body", body))
        self.lower = np.asarray(config.workspace_lower, dtype=float)
        self.upper = np.asarray(config.workspace_upper, dtype=float)

    def positions(self, target: np.ndarray) -> np.ndarray:
        self.data.qpos[self.qpos_index] = target
        self._mujoco.mj_kinematics(self.model, self.data)
        return np.array([self.data.site_xpos[i] if kind == "site" else self.data.xpos[i] for kind, i in self.points])

    def contains(self, target: np.ndarray) -> bool:
        points = self.positions(target)
        return bool(((points >= self.lower) & (points <= self.upper)).all())


_EMPTY = np.zeros(0)
STALE = "no valid, fresh joint state within max_state_age"


def beyond_limit(joint: str, tolerance: float) -> str:
    return f"joint '{joint}' measured beyond its hard limit + {tolerance}: sensor or calibration fault"


def too_fast(joint: str, ratio: float, fault: float) -> str:
    return f"joint '{joint}' measured at {ratio:.3g} times its velocity limit (fault above {fault}): sensor fault"


def missed(count: int) -> str:
    return f"{count} consecutive policy deadline misses"


def unusable(count: int, flag: int) -> str:
    return f"{count} consecutive unusable policy outputs ({Rule(flag).name})"


def parse_action(action) -> np.ndarray:
    """The policy's output as a flat float64 array; an empty one (misshaped) when it cannot be read as one."""
    try:
        return np.asarray(action, dtype=float).reshape(-1)
    except (TypeError, ValueError, OverflowError):
        return _EMPTY


class ReferenceShield:
    """The shield's rules in plain numpy: the specification that the compiled `Shield` is tested against
    tick for tick (`tests/safety/test_compiled_shield.py`), and the one to read."""

    def __init__(self, spec: RobotSpec, config: ShieldConfig | None = None, veto: Veto | None = None):
        self.spec, self.config, self.veto = spec, config or ShieldConfig(), veto
        cfg = self.config
        try:
            cfg.validate()
            if cfg.deadline is not None:
                checks.number("deadline", cfg.deadline, above=0.0, at_most=spec.control_period)
        except ValueError as err:
            raise ValueError(f"shield config: {err}") from None
        n = spec.num_joints
        self.names = spec.joint_names
        self._index = {name: i for i, name in enumerate(self.names)}
        limits = spec.array("position_limits")
        self.hard_lo, self.hard_hi = limits[:, 0], limits[:, 1]
        span = np.where(np.isfinite(self.hard_hi - self.hard_lo), self.hard_hi - self.hard_lo, 0.0)
        self.soft_lo = self.hard_lo + cfg.soft_limit_margin * span
        self.soft_hi = self.hard_hi - cfg.soft_limit_margin * span
        self.max_velocity = spec.array("velocity_limit")
        self.max_effort = spec.array("effort_limit")
        self.default = spec.array("default_position")
        self.kp, self.kd = spec.array("kp"), spec.array("kd")
        self.dt = spec.control_period
        self.deadline = cfg.deadline if cfg.deadline is not None else 0.5 * self.dt
        self.torque = spec.control_mode == "torque"
        if not self.torque and not (self.kp > 0).all():
            raise ValueError(f"shield: {spec.source}: position-controlled joints need kp > 0 (got {self.kp.tolist()})")
        scale, offset = action_mapping(spec)
        self.scale = scale if cfg.action_scale is None else np.asarray(cfg.action_scale, dtype=float)
        self.offset = offset if cfg.action_offset is None else np.asarray(cfg.action_offset, dtype=float)
        if self.scale.shape != (n,) or self.offset.shape != (n,):
            raise ValueError(f"shield: action_scale/action_offset need {n} entries (joints {self.names})")
        self._inv_scale = np.divide(1.0, self.scale, out=np.zeros(n), where=self.scale != 0)
        self.hold_kd = np.where(self.kd > 0, self.kd, cfg.damp_kd)
        self.fallback = cfg.fallback or ("damp" if spec.imu is not None else "hold")
        """The fallback in force: the configured one, or the robot's (damp for a floating base)."""
        self.workspace = Workspace(spec, cfg) if cfg.workspace_points else None
        # Per-tick constants: the rate window half-width and, for PD joints, the target offset from the
        # measured pose at which the PD torque reaches the effort limit.
        self._step = spec.rate_window
        self._inv_kp = np.divide(1.0, self.kp, out=np.zeros(n), where=self.kp > 0)
        self._effort_reach = self.max_effort * self._inv_kp
        self._brake = spec.array("stop_deceleration") * self.dt * self.dt
        """How much a stop shrinks the target step each tick (inf: at once)."""
        self.mode = Mode.PASSIVE
        self.counters = Counters()
        self._q: np.ndarray | None = None
        self._qd: np.ndarray | None = None
        self._last_valid: float | None = None
        self._previous = clip(self.default, self.hard_lo, self.hard_hi)
        self._last_step = np.zeros(n)
        """The last tick's commanded target step (zero unless stiff): the motion a stop brings to rest."""
        self._misses = self._bad = 0
        self._ramp_from: np.ndarray | None = None
        self._ramp_ticks = 0
        self._pending_reason = ""

    # --- operator inputs -------------------------------------------------------------------------
    def start(self, by: str = "operator start") -> bool:
        """PASSIVE -> RAMP, if a valid state is known and the robot is close enough to the default pose;
        `by` says who started it in the mode change's reason."""
        if self.mode != Mode.PASSIVE or self._q is None:
            return False
        distance = self._ramp_distance(self._q)
        if not distance <= self.config.ramp_max_distance:  # NaN is refused too
            self._pending_reason = (
                f"ramp refused: measured pose is {distance:.3f} from the default pose "
                f"(limit {self.config.ramp_max_distance})"
            )
            self.counters.count(Rule.RAMP_REFUSED)
            return False
        self._ramp_from = clip(self._q, self.hard_lo, self.hard_hi)
        self._previous = self._ramp_from.copy()
        self._ramp_ticks = 0
        self._set_mode(Mode.RAMP, f"{by}: ramping from the measured pose to the default pose")
        return True

    def within_ramp(self) -> bool | None:
        """Whether `start` would ramp from the measured pose (None: no valid pose yet), without trying."""
        if self._q is None:
            return None
        return self._ramp_distance(self._q) <= self.config.ramp_max_distance

    def _ramp_distance(self, q: np.ndarray) -> float:
        """How far the farthest joint of `q` is from the default pose, as far as the ramp is concerned. A torque
        robot's ramp damps and moves nothing, so a continuous joint (no finite limit: a hinge that
        counts whole turns) is as far as the nearest way round; a position robot's ramp would sweep
        every turn of the count, so there the count stands."""
        offset = q - self.default
        if self.torque:
            wrapped = np.remainder(offset + np.pi, 2 * np.pi) - np.pi
            offset = np.where(np.isinf(self.hard_lo) & np.isinf(self.hard_hi), wrapped, offset)
        return float(np.max(np.abs(offset)))

    def run(self) -> bool:
        """RAMP (finished) -> RUN."""
        if self.mode != Mode.RAMP or self._ramp_ticks * self.dt < self.config.ramp_time:
            return False
        self._misses = self._bad = 0
        self._set_mode(Mode.RUN, "operator run: policy in control")
        return True

    @property
    def has_pose(self) -> bool:
        """Whether a valid measured pose has been read: before one, a position target can only be the
        default pose, which must never be sent to a robot standing elsewhere."""
        return self._q is not None

    def estop(self, reason: str = "operator e-stop") -> None:
        self._set_mode(Mode.ESTOP, reason)

    def reset(self) -> None:
        """The only way out of ESTOP, HOLD or DAMP, and the way to abandon a ramp: back to PASSIVE."""
        if self.mode in (Mode.RAMP, Mode.ESTOP, Mode.HOLD, Mode.DAMP):
            self._set_mode(Mode.PASSIVE, "operator reset")

    def _set_mode(self, mode: Mode, reason: str) -> None:
        if mode != self.mode:
            self.mode = mode
            self._pending_reason = reason

    def fall_back(self, reason: str, mode: Mode | None = None) -> None:
        """RUN or RAMP -> HOLD or DAMP: `mode`, or the configured fallback. An input the shield does not
        see (a faulty IMU on a legged robot) asks for DAMP here, whatever the fallback for joint faults."""
        if mode is None:
            mode = Mode.HOLD if self.fallback == "hold" else Mode.DAMP
        if mode not in (Mode.HOLD, Mode.DAMP):
            raise ValueError(f"fall_back: expected HOLD or DAMP, got {mode.name}")
        if self.mode in (Mode.RUN, Mode.RAMP):
            self._set_mode(mode, reason)

    # --- one tick --------------------------------------------------------------------------------
    def _parse_state(self, names: Sequence[str], position, velocity) -> tuple[int, np.ndarray, np.ndarray]:
        """(flags, q, qd) in spec order: STATE_MISSING with empty arrays when the message cannot be read
        as one, or with NaN in the joints it lacks."""
        try:
            position = np.asarray(position, dtype=float).reshape(-1)
            velocity = np.asarray(velocity, dtype=float).reshape(-1)
            names = list(names)
        except (TypeError, ValueError, OverflowError):
            return R.STATE_MISSING, _EMPTY, _EMPTY
        if not len(names) == len(position) == len(velocity):
            return R.STATE_MISSING, _EMPTY, _EMPTY
        if names == self.names:  # the common case: the robot publishes in spec order
            return 0, position, velocity
        n = len(self.names)
        q, qd, seen = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool)
        for name, p, v in zip(names, position, velocity, strict=True):
            i = self._index.get(name)
            if i is not None:
                q[i], qd[i], seen[i] = p, v, True
        return (0 if seen.all() else R.STATE_MISSING), q, qd

    def _read_state(self, names: Sequence[str], position, velocity, stamp: float, now: float) -> int:
        flags, q, qd = self._parse_state(names, position, velocity)
        if not q.size and flags:
            return flags
        q, qd = q.copy(), qd.copy()
        if not (np.isfinite(q).all() and np.isfinite(qd).all()):
            flags |= R.STATE_NONFINITE
        if not (math.isfinite(stamp) and math.isfinite(now)) or not (-self.config.max_state_age <= now - stamp):
            flags |= R.STATE_STALE
        elif now - stamp > self.config.max_state_age:
            flags |= R.STATE_STALE
        if flags & (R.STATE_MISSING | R.STATE_NONFINITE):
            return flags
        tol = self.config.position_tolerance
        if (q < self.hard_lo - tol).any() or (q > self.hard_hi + tol).any():
            worst = self.names[int(np.argmax(np.maximum(self.hard_lo - q, q - self.hard_hi)))]
            self.estop(beyond_limit(worst, tol))
            return flags | R.STATE_OUT_OF_LIMITS
        speed = np.abs(qd) / self.max_velocity
        if (speed > self.config.velocity_fault_factor).any():
            worst = self.names[int(np.argmax(speed))]
            self.estop(too_fast(worst, float(speed.max()), self.config.velocity_fault_factor))
            return flags | R.STATE_OUT_OF_LIMITS
        if not flags & R.STATE_STALE:
            # A stamp ahead of the tick's clock must not keep the state fresh past max_state_age.
            self._q, self._qd, self._last_valid = q, qd, min(stamp, now)
        return flags

    def _action(self, action, policy_time: float | None) -> tuple[np.ndarray | None, int]:
        if action is None or (policy_time is not None and not policy_time <= self.deadline):
            self._misses += 1
            if self._misses >= self.config.max_deadline_misses:
                self.fall_back(missed(self._misses))
            return None, R.DEADLINE_MISS
        self._misses = 0
        action = parse_action(action)
        flag = 0
        if action.shape != (len(self.names),):
            flag = R.ACTION_SHAPE
        elif not np.isfinite(action).all():
            flag = R.ACTION_NONFINITE
        if flag:
            self._bad += 1
            if self._bad >= self.config.max_bad_actions:
                self.fall_back(unusable(self._bad, flag))
            return None, flag
        self._bad = 0
        return action, 0

    def tick(
        self,
        names: Sequence[str],
        position,
        velocity,
        stamp: float,
        now: float,
        action=None,
        policy_time: float | None = None,
    ) -> Command:
        """One control tick. `action` is the policy output in [-1, 1] (None when the policy produced
        nothing in time); `stamp` is when the state was measured and `now` the tick time (seconds)."""
        flags = self._read_state(names, position, velocity, stamp, now)
        age = self.config.max_state_age
        # A clock that jumps backwards past the last valid state makes it as untrustworthy as an old one.
        if self._last_valid is None or not (-age <= now - self._last_valid <= age):
            flags |= R.STATE_STALE
            self.fall_back(STALE)
        target = self._previous.copy()
        effort = np.zeros(len(self.names))
        wanted = None
        if self.mode == Mode.RUN:
            action, action_flags = self._action(action, policy_time)
            flags |= action_flags
            if action is not None and self.veto is not None and self._q is not None and self._qd is not None:
                if self.veto(self._q.copy(), self._qd.copy(), action.copy()):
                    flags |= R.VETO
                    action = None
            state_ok = not flags & (R.STATE_MISSING | R.STATE_NONFINITE | R.STATE_STALE)
            if action is not None and self.mode == Mode.RUN and state_ok:
                clipped = clip(action, -self.config.action_clip, self.config.action_clip)
                if (clipped != action).any():
                    flags |= R.ACTION_CLIPPED
                wanted = action
                if self.torque:
                    effort = command_from_action(clipped, self.scale, self.offset)
                else:
                    target = command_from_action(clipped, self.scale, self.offset)
        elif self.mode == Mode.RAMP:
            self._ramp_ticks += 1
            ramp = self.config.ramp_time
            alpha = min(1.0, self._ramp_ticks * self.dt / ramp) if ramp > 0 else 1.0
            assert self._ramp_from is not None, "RAMP starts from a measured pose"
            target = (1 - alpha) * self._ramp_from + alpha * self.default
        return self._finish(target, effort, flags, wanted)

    def _stopping(self) -> np.ndarray:
        """A stop's target: the last step shrunk by the stop deceleration, inside the soft window or no
        further out than the previous target (a stop started outside it is not pulled in)."""
        left = np.maximum(np.abs(self._last_step) - self._brake, 0.0)
        target = self._previous + clip(self._last_step, -left, left)
        return clip(target, np.minimum(self._previous, self.soft_lo), np.maximum(self._previous, self.soft_hi))

    def _finish(self, target: np.ndarray, effort: np.ndarray, flags: int, wanted: np.ndarray | None) -> Command:
        """`wanted`: the policy's action this tick, if it was used."""
        mode = self.mode
        n = len(self.names)
        q = self._q if self._q is not None else self._previous
        qd = self._qd if self._qd is not None else np.zeros(n)
        stiff = mode in (Mode.RAMP, Mode.RUN, Mode.HOLD) or (mode == Mode.ESTOP and self.fallback == "hold")
        if self.torque or not stiff:
            kp = np.zeros(n)
            kd = np.zeros(n) if mode == Mode.PASSIVE or (self.torque and mode == Mode.RUN) else self.hold_kd.copy()
            target = clip(q, self.hard_lo, self.hard_hi)
        else:
            kp, kd = self.kp.copy(), self.kd.copy()
            stopping = mode in (Mode.HOLD, Mode.ESTOP)
            lo = np.maximum(self._previous - self._step, self.hard_lo)
            hi = np.minimum(self._previous + self._step, self.hard_hi)
            if stopping:
                rated = self._stopping()
            else:
                soft = clip(target, self.soft_lo, self.soft_hi)
                if (soft != target).any():
                    flags |= R.POSITION_LIMIT
                rated = clip(soft, lo, hi)
                if (rated != soft).any():
                    flags |= R.RATE_LIMIT
            if self.workspace is not None and not self.workspace.contains(rated):
                flags |= R.WORKSPACE
                rated = self._previous.copy()
            if not stopping:
                # Position control requires kp > 0 (spec validation), so the effort window is always finite.
                center = q + self.kd * qd * self._inv_kp
                feasible = clip(clip(rated, center - self._effort_reach, center + self._effort_reach), lo, hi)
                if (feasible != rated).any():
                    flags |= R.EFFORT_LIMIT
                rated = feasible
            target = rated
        if not self.torque:
            scale = gain_scale(target, q, qd, kp, kd, self.max_effort)
            if (scale < 1.0).any():
                flags |= R.GAIN_REDUCED
                kp, kd = kp * scale, kd * scale
        if self.torque:
            limited = clip(effort, -self.max_effort, self.max_effort)
            limited = outward_effort_zeroed(limited, q, self.hard_lo, self.hard_hi)
            if (limited != effort).any():
                flags |= R.EFFORT_LIMIT
            damping = np.abs(kd * qd)
            headroom = np.maximum(self.max_effort - damping, 0.0)
            effort = clip(limited, -headroom, headroom)
            kd = np.where(damping > self.max_effort, kd * self.max_effort / np.maximum(damping, 1e-12), kd)
        self._last_step = target - self._previous if stiff and not self.torque else np.zeros(n)
        self._previous = target
        change = 0.0
        if wanted is not None and flags & _CLAMPS:  # in action units (`action_from_command`), cheaply
            sent = ((effort if self.torque else target) - self.offset) * self._inv_scale
            change = float(np.abs(sent - wanted).sum()) / n
        self.counters.add(flags, mode, change)
        reason, self._pending_reason = self._pending_reason, ""
        return Command(mode, target.copy(), kp, kd, effort, Rule(flags), reason)
