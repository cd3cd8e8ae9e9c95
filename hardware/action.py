"""The action mapping: how a policy action in [-1, 1] becomes a joint command in the robot's units.

One definition for the simulator's tasks, the shield, export and the transfer gate, so a policy is
trained, exported and shielded under the same mapping. The functions are plain arithmetic, so they
work on numpy arrays and torch tensors alike.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np

from q2real.hardware.spec import RobotSpec

Array = TypeVar("Array")


def action_mapping(spec: RobotSpec) -> tuple[np.ndarray, np.ndarray]:
    """(scale, offset) per joint, float64: torque joints command `action * effort_limit`; position joints
    a target around the default pose, `action` 1 reaching the nearer position limit (at most pi rad away,
    so continuous joints stay within a half turn)."""
    if spec.control_mode == "torque":
        scale = spec.array("effort_limit")
        return scale, np.zeros_like(scale)
    default = spec.array("default_position")
    limits = spec.array("position_limits")
    scale = np.minimum(np.minimum(limits[:, 1] - default, default - limits[:, 0]), math.pi)
    return scale, default


def command_from_action(action: Array, scale, offset) -> Array:
    """offset + scale * action (the action already clipped to [-1, 1] where the caller wants it)."""
    return offset + scale * action  # type: ignore[operator,return-value]


def action_from_command(command: Array, scale, offset) -> Array:
    """The inverse, for judging exported policies in simulation; a joint with scale 0 reads action 0."""
    safe = scale + (scale == 0)  # type: ignore[operator]
    return (command - offset) / safe * (scale != 0)  # type: ignore[operator,return-value]
