"""What the shield did on a tick: one bit per rule, so a log line or a diagnostics message says why."""

from __future__ import annotations

from enum import IntEnum, IntFlag


class Mode(IntEnum):
    PASSIVE = 0
    """Zero gains: the robot is limp (before start, and after a reset)."""
    RAMP = 1
    """Moving from the measured pose to the default pose before the policy takes over."""
    RUN = 2
    """The policy's actions, through every rule."""
    HOLD = 3
    """Stiff hold at the last safe target (arms)."""
    DAMP = 4
    """kp = 0, kd > 0 (legged robots: never stiff while falling)."""
    ESTOP = 5
    """Latched stop (HOLD or DAMP behaviour); only an explicit reset clears it."""


class Rule(IntFlag):
    STATE_MISSING = 1 << 0
    """A spec joint was absent from the joint state."""
    STATE_NONFINITE = 1 << 1
    STATE_OUT_OF_LIMITS = 1 << 2
    """A measured position beyond the hard limits plus tolerance: a fault."""
    STATE_STALE = 1 << 3
    ACTION_NONFINITE = 1 << 4
    ACTION_SHAPE = 1 << 5
    DEADLINE_MISS = 1 << 6
    VETO = 1 << 7
    """A learned veto replaced the action with the fallback."""
    ACTION_CLIPPED = 1 << 8
    POSITION_LIMIT = 1 << 9
    RATE_LIMIT = 1 << 10
    EFFORT_LIMIT = 1 << 11
    GAIN_REDUCED = 1 << 12
    """Even the closest feasible target could not keep the PD torque within the effort limit."""
    RAMP_REFUSED = 1 << 13
    WORKSPACE = 1 << 14
    """Forward kinematics of the target left the workspace box; the previous target was held."""


CLAMPS = (
    Rule.ACTION_CLIPPED | Rule.POSITION_LIMIT | Rule.RATE_LIMIT | Rule.EFFORT_LIMIT | Rule.GAIN_REDUCED | Rule.WORKSPACE
)
"""The rules that change a running policy's command (the rest are faults and their fallbacks): what an
intervention counts."""
