"""The action mapping: how a policy action in [-1, 1] becomes a joint command in the robot's units.

One definition for the simulator's tasks, the shield, export and the transfer gate, so a policy is
trained, exported and shielded under the same mapping. The functions are plain arithmetic, so they
work on numpy arrays and torch tensors alike.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np

from q2real.hardware.spec import RobotSpec, SpecError

Array = TypeVar("Array")


def action_mapping(spec: RobotSpec, action_scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scale, offset) per joint, float64.

    Torque joints command `action * action_scale * effort_limit` (`action_scale` a fraction in (0, 1];
    None: the whole effort limit). Position joints command a target around the default pose, `action`
    1 reaching `action_scale` rad away (None: the nearer position limit), never beyond the nearer limit
    nor more than pi rad away, so continuous joints stay within a half turn.
    """
    if action_scale is not None and not (0 < action_scale <= (1.0 if spec.control_mode == "torque" else math.pi)):
        unit = "a fraction of the effort limit in (0, 1]" if spec.control_mode == "torque" else "rad in (0, pi]"
        raise SpecError(
            f"{spec.source}: action_scale: expected {unit} for a {spec.control_mode} robot, got {action_scale}"
        )
    if spec.control_mode == "torque":
        scale = spec.array("effort_limit") * (1.0 if action_scale is None else action_scale)
        return scale, np.zeros_like(scale)
    default = spec.array("default_position")
    limits = spec.array("position_limits")
    reach = math.pi if action_scale is None else action_scale
    scale = np.minimum(np.minimum(limits[:, 1] - default, default - limits[:, 0]), reach)
    return scale, default


def command_from_action(action: Array, scale, offset) -> Array:
    """offset + scale * action (the action already clipped to [-1, 1] where the caller wants it)."""
    return offset + scale * action  # type: ignore[operator,return-value]


def action_from_command(command: Array, scale, offset) -> Array:
    """The inverse, for judging exported policies in simulation; a joint with scale 0 reads action 0."""
    safe = scale + (scale == 0)  # type: ignore[operator]
    return (command - offset) / safe * (scale != 0)  # type: ignore[operator,return-value]
