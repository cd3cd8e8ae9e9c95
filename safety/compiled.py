"""The shield's tick compiled with numba: the same rules as `ReferenceShield`, in the same order and with
the same floating-point operations, as scalar loops over preallocated arrays.

A tick of the reference shield is a few dozen small numpy calls, each a few microseconds of dispatch;
here it is one call into machine code that allocates nothing and touches no Python object. What stays
in Python is what a tick rarely needs: reading a message that is not in spec order, a learned veto, the
workspace's forward kinematics, and the words of a mode change (the kernel returns an event code).

The kernels are compiled when this module is imported, for exactly the array types the wrapper passes
(C-contiguous float64 and int64): no tick can wait on the compiler, and an input of another type is a
TypeError, never a compile. numba caches the machine code on disk; `COMPILE_SECONDS` says what the
import cost. `import q2real.safety` alone does not compile: `Shield` is imported on first use.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from types import SimpleNamespace

import numba
import numpy as np

from q2real.hardware import RobotSpec
from q2real.safety.flags import CLAMPS, Mode, Rule
from q2real.safety.shield import (
    RUN_INTERVENTIONS,
    RUN_TICKS,
    STALE,
    TICKS,
    Command,
    ReferenceShield,
    ShieldConfig,
    Veto,
    beyond_limit,
    missed,
    parse_action,
    too_fast,
    unusable,
)

# Rows of the per-joint constants `limits` (one column per joint).
(
    HARD_LO,
    HARD_HI,
    SOFT_LO,
    SOFT_HI,
    MAX_V,
    MAX_E,
    DEFAULT,
    KP,
    KD,
    STEP,
    INV_KP,
    REACH,
    SCALE,
    OFFSET,
    INV_SCALE,
    HOLD_KD,
    BRAKE,
) = range(17)
# The scalar `settings`.
TOL, V_FAULT, AGE, CLIP, MAX_MISSES, MAX_BAD, RAMP_TIME, DT, TORQUE, HOLD_FALLBACK = range(10)
# Rows of the joint `state`, the `inputs` and the `outputs`.
Q, QD, PREV, RAMP_FROM, SCRATCH, LAST_STEP = range(6)
Q_IN, QD_IN, ACTION = range(3)
POS, GAIN_P, GAIN_D, EFFORT = range(4)
# Slots of the integer and the float state, `ints` and `floats`.
MODE, HAS_Q, MISSES, BAD, RAMP_TICKS, WANTED = range(6)
LAST_VALID = 0
# How the wrapper read the message and the action.
STATE_UNREADABLE, STATE_READ, STATE_PARTIAL = range(3)
ACTION_LATE, ACTION_MISSHAPED, ACTION_READ = range(3)
# Mode changes inside a tick, for the wrapper to put into words.
NO_EVENT, ESTOP_POSITION, ESTOP_VELOCITY, FALLBACK_STALE, FALLBACK_MISSES, FALLBACK_BAD = range(6)

# The rule bits as plain ints: numba reads module-level ints as constants.
ACTION_CLIPPED = int(Rule.ACTION_CLIPPED)
ACTION_NONFINITE = int(Rule.ACTION_NONFINITE)
ACTION_SHAPE = int(Rule.ACTION_SHAPE)
DEADLINE_MISS = int(Rule.DEADLINE_MISS)
EFFORT_LIMIT = int(Rule.EFFORT_LIMIT)
GAIN_REDUCED = int(Rule.GAIN_REDUCED)
POSITION_LIMIT = int(Rule.POSITION_LIMIT)
RATE_LIMIT = int(Rule.RATE_LIMIT)
STATE_MISSING = int(Rule.STATE_MISSING)
STATE_NONFINITE = int(Rule.STATE_NONFINITE)
STATE_OUT_OF_LIMITS = int(Rule.STATE_OUT_OF_LIMITS)
STATE_STALE = int(Rule.STATE_STALE)
VETO = int(Rule.VETO)
WORKSPACE = int(Rule.WORKSPACE)
_CLAMPS = int(CLAMPS)
_UNUSABLE_STATE = STATE_MISSING | STATE_NONFINITE | STATE_STALE
PASSIVE, RAMP, RUN, HOLD, DAMP, ESTOP = (int(m) for m in Mode)
_MODES = tuple(Mode)


def _plain(values, shape: tuple[int]) -> bool:
    """A float64 array of the spec's length: copied as it is, without `np.asarray`."""
    return type(values) is np.ndarray and values.shape == shape and values.dtype.char == "d"


@functools.cache
def _rule(flags: int) -> Rule:
    """Rule(flags), looked up once per combination: building an IntFlag costs a microsecond."""
    return Rule(flags)


MAX_JOINTS = 128
"""Up to here numpy sums `run_change` in one block, as `pairwise` does."""

_jit = functools.partial(numba.njit, cache=True, nogil=True, error_model="numpy", boundscheck=False)
"""Helpers compile with the kernels that call them; numba keeps the machine code in __pycache__."""
_table, _row, _ints = numba.float64[:, ::1], numba.float64[::1], numba.int64[::1]
_STATE = (_table, _row, _table, _ints)  # limits, settings, state, ints
_COMPILE_STARTED = time.perf_counter()


@_jit
def maximum(a, b):
    """np.maximum on scalars: NaN wins."""
    if a != a or b != b:
        return math.nan
    return a if a > b else b


@_jit
def minimum(a, b):
    if a != a or b != b:
        return math.nan
    return a if a < b else b


@_jit
def clip(x, lo, hi):
    """`q2real.safety.limits.clip`: min(max(x, lo), hi)."""
    return minimum(maximum(x, lo), hi)


@_jit
def pairwise(a, n):
    """numpy's pairwise summation of a[:n] (`np.add.reduce` on a contiguous float64 array) up to its
    first split at 128 elements: eight interleaved partial sums, added as a tree, then the rest."""
    if n < 8:
        total = 0.0
        for i in range(n):
            total += a[i]
        return total
    r0, r1, r2, r3, r4, r5, r6, r7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    i = 8
    while i < n - n % 8:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        total += a[i]
        i += 1
    return total


@_jit
def fall_back(ints, settings):
    """RUN or RAMP -> HOLD or DAMP; True if the mode changed."""
    if ints[MODE] == RUN or ints[MODE] == RAMP:
        ints[MODE] = HOLD if settings[HOLD_FALLBACK] else DAMP
        return True
    return False


@_jit((numba.int64, numba.boolean, numba.boolean))
def stiff(mode, hold_fallback, torque):
    """Whether the position rules (soft limits, rate, workspace, effort window) run this tick."""
    if torque:
        return False
    return mode == RAMP or mode == RUN or mode == HOLD or (mode == ESTOP and hold_fallback)


@_jit((*_STATE, _row, _table, numba.int64, numba.float64, numba.float64, numba.int64))
def read(limits, settings, state, ints, floats, inputs, parse, stamp, now, action_code):
    """State validity, staleness and (in RUN) the action's: `_read_state`, the stale fallback and
    `_action`. Returns (flags, event, joint or count, value, whether the action is usable)."""
    n = limits.shape[1]
    flags = 0
    event, index, value = NO_EVENT, 0, 0.0
    if parse == STATE_UNREADABLE:
        flags = STATE_MISSING
    else:
        if parse == STATE_PARTIAL:
            flags |= STATE_MISSING
        for i in range(n):
            if not (math.isfinite(inputs[Q_IN, i]) and math.isfinite(inputs[QD_IN, i])):
                flags |= STATE_NONFINITE
                break
        age = settings[AGE]
        if not (math.isfinite(stamp) and math.isfinite(now)) or not (-age <= now - stamp):
            flags |= STATE_STALE
        elif now - stamp > age:
            flags |= STATE_STALE
        if not flags & (STATE_MISSING | STATE_NONFINITE):
            tol = settings[TOL]
            beyond = False
            for i in range(n):
                if inputs[Q_IN, i] < limits[HARD_LO, i] - tol or inputs[Q_IN, i] > limits[HARD_HI, i] + tol:
                    beyond = True
            if beyond:
                worst, over = 0, -math.inf
                for i in range(n):
                    v = maximum(limits[HARD_LO, i] - inputs[Q_IN, i], inputs[Q_IN, i] - limits[HARD_HI, i])
                    if i == 0 or v > over:
                        worst, over = i, v
                if ints[MODE] != ESTOP:
                    ints[MODE] = ESTOP
                    event, index = ESTOP_POSITION, worst
                flags |= STATE_OUT_OF_LIMITS
            else:
                too_fast = False
                for i in range(n):
                    if abs(inputs[QD_IN, i]) / limits[MAX_V, i] > settings[V_FAULT]:
                        too_fast = True
                if too_fast:
                    worst, fastest = 0, -math.inf
                    for i in range(n):
                        speed = abs(inputs[QD_IN, i]) / limits[MAX_V, i]
                        if i == 0 or speed > fastest:
                            worst, fastest = i, speed
                    if ints[MODE] != ESTOP:
                        ints[MODE] = ESTOP
                        event, index, value = ESTOP_VELOCITY, worst, fastest
                    flags |= STATE_OUT_OF_LIMITS
                elif not flags & STATE_STALE:
                    for i in range(n):
                        state[Q, i] = inputs[Q_IN, i]
                        state[QD, i] = inputs[QD_IN, i]
                    ints[HAS_Q] = 1
                    floats[LAST_VALID] = stamp if stamp <= now else now
    age = settings[AGE]
    last = floats[LAST_VALID]
    if not (-age <= now - last <= age):  # NaN before the first valid state
        flags |= STATE_STALE
        if fall_back(ints, settings):
            event = FALLBACK_STALE
    usable = False
    if ints[MODE] == RUN:
        if action_code == ACTION_LATE:
            ints[MISSES] += 1
            flags |= DEADLINE_MISS
            if ints[MISSES] >= settings[MAX_MISSES] and fall_back(ints, settings):
                event, index = FALLBACK_MISSES, ints[MISSES]
        else:
            ints[MISSES] = 0
            flag = 0
            if action_code == ACTION_MISSHAPED:
                flag = ACTION_SHAPE
            else:
                for i in range(n):
                    if not math.isfinite(inputs[ACTION, i]):
                        flag = ACTION_NONFINITE
                        break
            if flag:
                flags |= flag
                ints[BAD] += 1
                if ints[BAD] >= settings[MAX_BAD] and fall_back(ints, settings):
                    event, index, value = FALLBACK_BAD, ints[BAD], float(flag)
            else:
                ints[BAD] = 0
                usable = True
    return flags, event, index, value, usable


@_jit((*_STATE, _table, _table, numba.int64, numba.boolean))
def command(limits, settings, state, ints, inputs, outputs, flags, usable):
    """The policy's command (RUN) or the ramp's, then the soft position window and the rate limit, or a
    stop's target: `tick` after `_action`, and `_finish` up to the workspace check."""
    n = limits.shape[1]
    mode = ints[MODE]
    torque = settings[TORQUE] != 0.0
    for i in range(n):
        outputs[POS, i] = state[PREV, i]
        outputs[EFFORT, i] = 0.0
    ints[WANTED] = 0
    if mode == RUN:
        if usable and ints[MODE] == RUN and not flags & _UNUSABLE_STATE:
            c = settings[CLIP]
            for i in range(n):
                a = inputs[ACTION, i]
                clipped = clip(a, -c, c)
                if clipped != a:
                    flags |= ACTION_CLIPPED
                if torque:
                    outputs[EFFORT, i] = limits[OFFSET, i] + limits[SCALE, i] * clipped
                else:
                    outputs[POS, i] = limits[OFFSET, i] + limits[SCALE, i] * clipped
            ints[WANTED] = 1
    elif mode == RAMP:
        ints[RAMP_TICKS] += 1
        ramp = settings[RAMP_TIME]
        alpha = 1.0
        if ramp > 0:
            x = ints[RAMP_TICKS] * settings[DT] / ramp
            alpha = x if x < 1.0 else 1.0
        for i in range(n):
            outputs[POS, i] = (1 - alpha) * state[RAMP_FROM, i] + alpha * limits[DEFAULT, i]
    has_q = ints[HAS_Q] != 0
    if torque or not stiff(mode, settings[HOLD_FALLBACK] != 0.0, torque):
        passive = mode == PASSIVE or (torque and mode == RUN)
        for i in range(n):
            q = state[Q, i] if has_q else state[PREV, i]
            outputs[GAIN_P, i] = 0.0
            outputs[GAIN_D, i] = 0.0 if passive else limits[HOLD_KD, i]
            outputs[POS, i] = clip(q, limits[HARD_LO, i], limits[HARD_HI, i])
        return flags
    stopping = mode == HOLD or mode == ESTOP
    for i in range(n):
        outputs[GAIN_P, i] = limits[KP, i]
        outputs[GAIN_D, i] = limits[KD, i]
        if stopping:
            previous, step = state[PREV, i], state[LAST_STEP, i]
            left = maximum(abs(step) - limits[BRAKE, i], 0.0)
            target = previous + clip(step, -left, left)
            lo = minimum(previous, limits[SOFT_LO, i])
            hi = maximum(previous, limits[SOFT_HI, i])
            outputs[POS, i] = clip(target, lo, hi)
            continue
        target = outputs[POS, i]
        soft = clip(target, limits[SOFT_LO, i], limits[SOFT_HI, i])
        if soft != target:
            flags |= POSITION_LIMIT
        lo = maximum(state[PREV, i] - limits[STEP, i], limits[HARD_LO, i])
        hi = minimum(state[PREV, i] + limits[STEP, i], limits[HARD_HI, i])
        rated = clip(soft, lo, hi)
        if rated != soft:
            flags |= RATE_LIMIT
        outputs[POS, i] = rated
    return flags


@_jit((*_STATE, _ints, _row, _table, _table, numba.int64))
def finish(limits, settings, state, ints, counts, change, inputs, outputs, flags):
    """`_finish` after the workspace check: the effort window (not while stopping), the gains, the
    torque limits, the counters, the last step and the new previous target."""
    n = limits.shape[1]
    mode = ints[MODE]
    torque = settings[TORQUE] != 0.0
    has_q = ints[HAS_Q] != 0
    is_stiff = stiff(mode, settings[HOLD_FALLBACK] != 0.0, torque)
    if is_stiff and not (mode == HOLD or mode == ESTOP):
        for i in range(n):
            q = state[Q, i] if has_q else state[PREV, i]
            qd = state[QD, i] if has_q else 0.0
            lo = maximum(state[PREV, i] - limits[STEP, i], limits[HARD_LO, i])
            hi = minimum(state[PREV, i] + limits[STEP, i], limits[HARD_HI, i])
            center = q + limits[KD, i] * qd * limits[INV_KP, i]
            rated = outputs[POS, i]
            feasible = clip(clip(rated, center - limits[REACH, i], center + limits[REACH, i]), lo, hi)
            if feasible != rated:
                flags |= EFFORT_LIMIT
            outputs[POS, i] = feasible
    if not torque:
        reduced = False
        for i in range(n):
            q = state[Q, i] if has_q else state[PREV, i]
            qd = state[QD, i] if has_q else 0.0
            pd = abs(outputs[GAIN_P, i] * (outputs[POS, i] - q) - outputs[GAIN_D, i] * qd)
            me = limits[MAX_E, i]
            scale = 1.0 if pd <= me else me / maximum(pd, me)
            if scale != scale:
                scale = 0.0
            if scale < 1.0:
                reduced = True
            outputs[GAIN_P, i] = outputs[GAIN_P, i] * scale
            outputs[GAIN_D, i] = outputs[GAIN_D, i] * scale
        if reduced:
            flags |= GAIN_REDUCED
    else:
        for i in range(n):
            q = state[Q, i] if has_q else state[PREV, i]
            qd = state[QD, i] if has_q else 0.0
            me = limits[MAX_E, i]
            effort = outputs[EFFORT, i]
            limited = clip(effort, -me, me)
            if (q >= limits[HARD_HI, i] and limited > 0) or (q <= limits[HARD_LO, i] and limited < 0):
                limited = 0.0
            if limited != effort:
                flags |= EFFORT_LIMIT
            kd = outputs[GAIN_D, i]
            damping = abs(kd * qd)
            headroom = maximum(me - damping, 0.0)
            outputs[EFFORT, i] = clip(limited, -headroom, headroom)
            if damping > me:
                outputs[GAIN_D, i] = kd * me / maximum(damping, 1e-12)
    for i in range(n):
        state[LAST_STEP, i] = outputs[POS, i] - state[PREV, i] if is_stiff else 0.0
        state[PREV, i] = outputs[POS, i]
    counts[TICKS] += 1
    if mode == RUN:
        counts[RUN_TICKS] += 1
        if flags & _CLAMPS:
            counts[RUN_INTERVENTIONS] += 1
            if ints[WANTED]:
                sent_row = EFFORT if torque else POS
                for i in range(n):
                    sent = (outputs[sent_row, i] - limits[OFFSET, i]) * limits[INV_SCALE, i]
                    state[SCRATCH, i] = abs(sent - inputs[ACTION, i])
                change[0] += pairwise(state[SCRATCH], n) / n
    bits = flags
    bit = 0
    while bits:
        if bits & 1:
            counts[bit] += 1
        bits >>= 1
        bit += 1
    return flags


@_jit((*_STATE, _row, _ints, _row, _table, _table, numba.int64, numba.float64, numba.float64, numba.int64))
def tick(limits, settings, state, ints, floats, counts, change, inputs, outputs, parse, stamp, now, action_code):
    """A whole tick, for a shield with neither a veto nor a workspace box."""
    flags, event, index, value, usable = read(
        limits, settings, state, ints, floats, inputs, parse, stamp, now, action_code
    )
    flags = command(limits, settings, state, ints, inputs, outputs, flags, usable)
    flags = finish(limits, settings, state, ints, counts, change, inputs, outputs, flags)
    return flags, event, index, value


KERNELS = SimpleNamespace(read=read, command=command, finish=finish, tick=tick, stiff=stiff)
COMPILE_SECONDS = time.perf_counter() - _COMPILE_STARTED
"""What importing this module spent compiling the kernels, or loading them from numba's cache: paid
before any shield exists, so never on a tick (about 8 s the first time on a 2-core machine, under 1 s
from the cache)."""


def _int_slot(slot: int) -> property:
    """One of the reference's integer attributes, kept in the kernel's `ints`."""

    def get(shield: Shield) -> int:
        return int(shield._ints[slot])

    def set_(shield: Shield, value: int) -> None:
        shield._ints[slot] = value

    return property(get, set_)


class Shield(ReferenceShield):
    """The shield used on robots: `ReferenceShield`'s rules and operator interface, its tick compiled.

    The reference keeps its state in Python attributes; here the same names are views of the kernel's
    arrays, so the mode machine (`start`, `run`, `reset`, `estop`, `fall_back`) is the reference's own.
    """

    def __init__(self, spec: RobotSpec, config: ShieldConfig | None = None, veto: Veto | None = None):
        n = spec.num_joints
        if n > MAX_JOINTS:
            raise ValueError(f"shield: {spec.source}: {n} joints, over the compiled shield's {MAX_JOINTS}")
        self._state = np.zeros((6, n))
        self._ints = np.zeros(6, dtype=np.int64)
        self._floats = np.full(1, math.nan)
        self._inputs = np.zeros((3, n))
        self._outputs = np.zeros((4, n))
        super().__init__(spec, config, veto)
        cfg = self.config
        self._limits = np.ascontiguousarray(
            np.stack(
                [
                    self.hard_lo,
                    self.hard_hi,
                    self.soft_lo,
                    self.soft_hi,
                    self.max_velocity,
                    self.max_effort,
                    self.default,
                    self.kp,
                    self.kd,
                    self._step,
                    self._inv_kp,
                    self._effort_reach,
                    self.scale,
                    self.offset,
                    self._inv_scale,
                    self.hold_kd,
                    self._brake,
                ]
            ),
            dtype=np.float64,
        )
        self._settings = np.array(
            [
                cfg.position_tolerance,
                cfg.velocity_fault_factor,
                cfg.max_state_age,
                cfg.action_clip,
                cfg.max_deadline_misses,
                cfg.max_bad_actions,
                cfg.ramp_time,
                self.dt,
                float(self.torque),
                float(self.fallback == "hold"),
            ]
        )
        self._k = KERNELS
        self._shape = (n,)
        self._q_in, self._qd_in, self._action_in = self._inputs[Q_IN], self._inputs[QD_IN], self._inputs[ACTION]
        # One kernel call per tick unless Python has to act between the rules.
        self._fused = self.veto is None and self.workspace is None

    # --- the reference's attributes, as views of the kernel's state ----------------------------
    @property
    def mode(self) -> Mode:  # type: ignore[override]
        return _MODES[self._ints[MODE]]

    @mode.setter
    def mode(self, mode: Mode) -> None:
        self._ints[MODE] = int(mode)

    @property
    def _q(self) -> np.ndarray | None:  # type: ignore[override]
        return self._state[Q] if self._ints[HAS_Q] else None

    @_q.setter
    def _q(self, q: np.ndarray | None) -> None:
        self._ints[HAS_Q] = q is not None
        if q is not None:
            self._state[Q] = q

    @property
    def _qd(self) -> np.ndarray | None:  # type: ignore[override]
        return self._state[QD] if self._ints[HAS_Q] else None

    @_qd.setter
    def _qd(self, qd: np.ndarray | None) -> None:
        if qd is not None:
            self._state[QD] = qd

    @property
    def _last_valid(self) -> float | None:  # type: ignore[override]
        last = float(self._floats[LAST_VALID])
        return None if math.isnan(last) else last

    @_last_valid.setter
    def _last_valid(self, value: float | None) -> None:
        self._floats[LAST_VALID] = math.nan if value is None else value

    @property
    def _previous(self) -> np.ndarray:  # type: ignore[override]
        return self._state[PREV]

    @_previous.setter
    def _previous(self, value: np.ndarray) -> None:
        self._state[PREV] = value

    @property
    def _last_step(self) -> np.ndarray:  # type: ignore[override]
        return self._state[LAST_STEP]

    @_last_step.setter
    def _last_step(self, value: np.ndarray) -> None:
        self._state[LAST_STEP] = value

    @property
    def _ramp_from(self) -> np.ndarray:  # type: ignore[override]
        return self._state[RAMP_FROM]

    @_ramp_from.setter
    def _ramp_from(self, value: np.ndarray | None) -> None:
        if value is not None:
            self._state[RAMP_FROM] = value

    _misses = _int_slot(MISSES)
    _bad = _int_slot(BAD)
    _ramp_ticks = _int_slot(RAMP_TICKS)

    # --- one tick --------------------------------------------------------------------------------
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
        """`ReferenceShield.tick`, compiled: the same command, flags, counters and mode changes."""
        inputs, k = self._inputs, self._k
        if names == self.names and _plain(position, self._shape) and _plain(velocity, self._shape):
            self._q_in[:] = position  # the common case: spec order, float64, no copy in `_parse_state`
            self._qd_in[:] = velocity
            read = STATE_READ
        else:
            parse, q, qd = self._parse_state(names, position, velocity)
            if not q.size and parse:
                read = STATE_UNREADABLE
            else:
                self._q_in[:] = q
                self._qd_in[:] = qd
                read = STATE_PARTIAL if parse else STATE_READ
        code = ACTION_LATE
        if self._ints[MODE] == RUN and not (
            action is None or (policy_time is not None and not policy_time <= self.deadline)
        ):
            if not _plain(action, self._shape):
                action = parse_action(action)
            if action.shape == self._shape:
                self._action_in[:] = action
                code = ACTION_READ
            else:
                code = ACTION_MISSHAPED
        stamp, now = float(stamp), float(now)
        limits, settings, state, ints, floats, outputs = (
            self._limits,
            self._settings,
            self._state,
            self._ints,
            self._floats,
            self._outputs,
        )
        counts, change = self.counters.counts, self.counters.change
        if self._fused:
            flags, event, index, value = k.tick(
                limits, settings, state, ints, floats, counts, change, inputs, outputs, read, stamp, now, code
            )
        else:
            flags, event, index, value, usable = k.read(
                limits, settings, state, ints, floats, inputs, read, stamp, now, code
            )
            if usable and self.veto is not None and ints[HAS_Q]:
                if self.veto(state[Q].copy(), state[QD].copy(), inputs[ACTION].copy()):
                    flags |= VETO
                    usable = False
            flags = k.command(limits, settings, state, ints, inputs, outputs, flags, usable)
            if self.workspace is not None and k.stiff(ints[MODE], settings[HOLD_FALLBACK] != 0.0, self.torque):
                if not self.workspace.contains(outputs[POS]):
                    flags |= WORKSPACE
                    outputs[POS] = state[PREV]
            flags = k.finish(limits, settings, state, ints, counts, change, inputs, outputs, flags)
        if event != NO_EVENT:
            self._pending_reason = self._event_reason(event, index, value)
        reason, self._pending_reason = self._pending_reason, ""
        out = outputs.copy()  # one copy, four rows: the caller may keep the command
        return Command(_MODES[ints[MODE]], out[POS], out[GAIN_P], out[GAIN_D], out[EFFORT], _rule(flags), reason)

    def _event_reason(self, event: int, index: int, value: float) -> str:
        if event == ESTOP_POSITION:
            return beyond_limit(self.names[index], self.config.position_tolerance)
        if event == ESTOP_VELOCITY:
            return too_fast(self.names[index], value, self.config.velocity_fault_factor)
        if event == FALLBACK_STALE:
            return STALE
        if event == FALLBACK_MISSES:
            return missed(index)
        return unusable(index, int(value))
