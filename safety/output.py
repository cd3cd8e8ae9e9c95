"""The last stage of every tick: the shield's command in the robot's own interface, exactly as it is
published. Nothing changes a command after this.

A position robot gets the shield's position targets (its drives run the PD). An effort interface
has no PD of its own, so here the shield's command becomes torque: feed-forward effort plus the
shield's gains on the measured state, only with a state the shield accepted this tick (a stale or
faulty velocity damps nothing), clipped to the spec's effort limits. When the node stops, a torque
robot gets zero effort: a controller keeps its last command after the node is gone, and a damping
torque would stay latched.
"""

from __future__ import annotations

import numpy as np

from q2real.hardware import RobotSpec
from q2real.safety.flags import Rule
from q2real.safety.limits import clip
from q2real.safety.shield import Command

UNUSABLE_STATE = int(Rule.STATE_MISSING | Rule.STATE_NONFINITE | Rule.STATE_OUT_OF_LIMITS | Rule.STATE_STALE)
"""The shield's flags for a joint state it did not accept."""


class Output:
    """`spec`'s command interface: `effort` for a torque robot, `position` otherwise."""

    def __init__(self, spec: RobotSpec):
        self.torque = spec.control_mode == "torque"
        self.interface = "effort" if self.torque else "position"
        self._effort_limit = spec.array("effort_limit")

    def __call__(self, command: Command, q: np.ndarray | None, qd: np.ndarray | None) -> np.ndarray:
        """Per joint, what is sent: effort or position target. `q`, `qd`: the state the shield was
        given (None without a joint state yet)."""
        if not self.torque:
            return command.position
        values = command.effort
        if q is not None and qd is not None and not int(command.flags) & UNUSABLE_STATE:
            values = values + command.kp * (command.position - q) - command.kd * qd
        return clip(values, -self._effort_limit, self._effort_limit)

    def stopped(self, values: np.ndarray) -> np.ndarray:
        """The node's last command, from its final e-stop tick's `values`."""
        return np.zeros_like(values) if self.torque else values
