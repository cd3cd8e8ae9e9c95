"""One action mapping: the task, the shield and the gate's inverse all use `q2real.hardware.action`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from q2real.hardware import robot_spec
from q2real.hardware.action import action_from_command, action_mapping, command_from_action
from q2real.safety.shield import Shield, ShieldConfig
from q2real.sim import make

TASKS = {"pendulum": "pendulum_swingup", "panda": "panda_reach", "spot": "spot_joystick"}


@pytest.mark.parametrize("robot", sorted(TASKS))
def test_task_and_shield_map_actions_as_the_spec_says(robot: str) -> None:
    spec = robot_spec(robot)
    scale, offset = action_mapping(spec)
    env = make(task=TASKS[robot], num_envs=1, backend="mujoco", device="cpu")
    try:
        np.testing.assert_allclose(env.task.command_scale.numpy(), scale, rtol=1e-6)
        np.testing.assert_allclose(env.task.command_offset.numpy(), offset, rtol=1e-6)
    finally:
        env.close()
    shield = Shield(spec, ShieldConfig())
    np.testing.assert_array_equal(shield.scale, scale)
    np.testing.assert_array_equal(shield.offset, offset)
    if spec.control_mode == "torque":
        np.testing.assert_array_equal(scale, spec.array("effort_limit"))
    else:
        low, high = spec.array("position_limits").T
        assert (offset + scale <= high).all() and (offset - scale >= low).all()


def test_the_inverse_undoes_the_mapping_on_numpy_and_torch() -> None:
    scale, offset = np.array([2.0, 0.0, 0.5]), np.array([0.1, 0.3, -1.0])
    action = np.array([[0.5, 0.7, -1.0]])
    command = command_from_action(action, scale, offset)
    np.testing.assert_allclose(command, [[1.1, 0.3, -1.5]])
    np.testing.assert_allclose(action_from_command(command, scale, offset), [[0.5, 0.0, -1.0]])  # scale 0 reads 0
    as_torch = action_from_command(torch.tensor(command), torch.tensor(scale), torch.tensor(offset))
    np.testing.assert_allclose(as_torch.numpy(), [[0.5, 0.0, -1.0]])
