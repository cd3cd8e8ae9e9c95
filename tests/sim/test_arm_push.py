"""Panda push's reach term with `approach: behind`: the pusher is drawn to the cube's far side from
the target, where a push moves the cube toward it."""

from __future__ import annotations

import math

import pytest
import torch

from q2real.configs.loader import ConfigError
from q2real.sim import make
from q2real.sim.tasks.arm_push import CUBE_HALF_SIZE, PUSHER_RADIUS


def push(approach: str):
    return make(
        task="panda_push", num_envs=2, device="cpu", backend="mujoco", seed=0, task_params={"approach": approach}
    )


def test_the_approach_point_lies_behind_the_cube_on_the_line_from_the_target() -> None:
    env = push("behind")
    task = env.task
    task.command = torch.tensor([[0.7, 0.0], [0.5, 0.3]])
    cube = torch.tensor([[0.5, 0.0, 0.025], [0.5, 0.1, 0.025]])
    gap = CUBE_HALF_SIZE + PUSHER_RADIUS
    expected = torch.tensor([[0.5 - gap, 0.0, 0.025], [0.5, 0.1 - gap, 0.025]])
    torch.testing.assert_close(task.approach_point(cube), expected)
    task.command = cube[:, :2].clone()  # on the target: no direction, and no NaN
    assert torch.isfinite(task.approach_point(cube)).all()
    env.close()


def test_the_reward_pays_for_the_pusher_near_the_approach_point_by_hand() -> None:
    for approach in ("cube", "behind"):
        env = push(approach)
        env.reset(seed=1)
        physics, task = env.physics, env.task
        cube = task.cube_position(physics)
        pusher = task._ee(physics.qpos)
        point = cube if approach == "cube" else task.approach_point(cube)
        for i in range(env.num_envs):
            reach = 1 - math.tanh(float((pusher[i] - point[i]).norm()) / 0.1)
            pushed = 1 - math.tanh(float((cube[i, :2] - task.command[i]).norm()) / 0.1)
            reward = task.reward(physics, torch.zeros(env.num_envs, env.action_dim))
            assert float(reward[i]) == pytest.approx((reach + 4 * pushed) / 5, abs=1e-5)
        env.close()


def test_an_unknown_approach_is_refused_by_key() -> None:
    with pytest.raises(ConfigError, match=r"task_params.approach"):
        push("sideways")
