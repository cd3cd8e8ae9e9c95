"""Each task's declared safety cost, checked on states placed by hand."""

from __future__ import annotations

import pytest
import torch

from q2real.configs.loader import ConfigError
from q2real.sim import make

BOX = {"keepout_low": [0.35, -0.1, 0.28], "keepout_high": [0.55, 0.1, 0.38]}


def test_the_keep_out_box_costs_1_while_the_end_effector_is_inside_it() -> None:
    env = make(task="panda_reach", num_envs=2, device="cpu", backend="mujoco", task_params=BOX | {"joint_noise": 0.0})
    env.reset(seed=0)
    task = env.task
    physics = env.physics
    assert (task.cost(physics, torch.zeros(2, 7)) == 0).all()  # the home pose is below the box
    # Placed by hand where forward kinematics (tested on its own) would put it: inside, and beside the box.
    task._ee = lambda qpos: torch.tensor([[0.45, 0.0, 0.33], [0.45, 0.15, 0.33]])
    assert task.cost(physics, torch.zeros(2, 7)).tolist() == [1.0, 0.0]
    plain = make(task="panda_reach", num_envs=2, device="cpu", backend="mujoco")
    plain.reset(seed=0)
    assert (plain.task.cost(plain.physics, torch.zeros(2, 7)) == 0).all()  # no box: never a cost


@pytest.mark.parametrize(
    "params",
    [
        {"keepout_low": [0.35, -0.1, 0.28]},
        {"keepout_low": [0.55, -0.1, 0.28], "keepout_high": [0.35, 0.1, 0.38]},
        {"keepout_low": [0.35, -0.1], "keepout_high": [0.55, 0.1]},
    ],
)
def test_a_malformed_keep_out_box_is_refused(params) -> None:
    with pytest.raises(ConfigError, match="keepout"):
        make(task="panda_reach", num_envs=1, device="cpu", backend="mujoco", task_params=params)


def test_the_cartpole_slider_costs_1_beyond_its_fraction_of_the_rail() -> None:
    env = make(task="cartpole_swingup", num_envs=3, device="cpu", task_params={"cost_fraction": 0.2})
    env.reset(seed=0)
    physics = env.physics
    physics.qpos[:, 0] = torch.tensor([0.0, 0.35, -0.37])  # the rail is 1.8 m each way: 0.36 m is the line
    assert env.task.cost(physics, torch.zeros(3, 1)).tolist() == [0.0, 0.0, 1.0]
