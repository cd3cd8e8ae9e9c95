"""The policy's earlier actions as an observation term (`action_history`), as the node keeps them."""

from __future__ import annotations

import pytest
import torch

from q2real.configs.loader import ConfigError
from q2real.sim import make


def test_the_history_is_the_actions_before_the_last_newest_first_and_each_episode_starts_empty() -> None:
    params = {"observe_last_action": True, "action_history": 2, "episode_length": 4}
    env = make(task="pendulum_swingup", num_envs=3, device="cpu", task_params=params)
    assert env.obs_names[-2:] == ("last_action", "action_history") and env.obs_dims[-1] == 2 * env.action_dim
    assert env.obs_sources is not None and env.obs_sources[-1] == {"kind": "action_history"}
    history = env.term_columns("action_history")
    obs = env.reset(seed=0)
    assert torch.all(obs[:, history] == 0)
    sent: list[torch.Tensor] = []
    gen = torch.Generator().manual_seed(0)
    for tick in range(6):
        sent.append(torch.rand(3, env.action_dim, generator=gen) * 2 - 1)
        obs = env.step(sent[-1]).obs
        # Episodes of 4 ticks: ticks 0-3, then a new episode from tick 4 whose first observation is empty.
        start = 4 if tick >= 4 else 0
        before = [sent[t] if t >= start else torch.zeros(3, env.action_dim) for t in (tick - 1, tick - 2)]
        if tick == 3:
            before = [torch.zeros(3, env.action_dim)] * 2  # the reset observation of the next episode
        torch.testing.assert_close(obs[:, history], torch.cat(before, dim=-1), msg=f"tick {tick}")
    env.close()


def test_a_history_without_the_last_action_or_of_negative_length_is_refused() -> None:
    with pytest.raises(ConfigError, match="action_history: expected 0, or a number of ticks >= 1 with observe"):
        make(task="pendulum_swingup", num_envs=1, device="cpu", task_params={"action_history": 2})
    with pytest.raises(ConfigError, match="got -1"):
        make(
            task="pendulum_swingup",
            num_envs=1,
            device="cpu",
            task_params={"observe_last_action": True, "action_history": -1},
        )


def test_resting_at_the_default_pose_keeps_the_rest_of_the_reset_state() -> None:
    """Where a robot's start ramp hands over: joints at the default pose, everything still, the base's
    pose, the command and the previous actions as the reset left them."""
    env = make(task="spot_joystick", num_envs=3, device="cpu", task_params={"observe_last_action": True})
    env.reset(seed=4)
    before, command = env.physics, env.task.command.clone()
    obs = env.rest_at_default_pose()
    task, after = env.task, env.physics
    default = torch.tensor(task.spec.array("default_position"), dtype=torch.float32).expand(3, -1)
    torch.testing.assert_close(after.qpos[:, task.qpos_index], default)
    assert torch.all(after.qvel == 0) and torch.equal(task.command, command)
    torch.testing.assert_close(after.qpos[:, :7], before.qpos[:, :7], msg="the base stays where the reset put it")
    torch.testing.assert_close(obs, task.observe(after), msg="the observation is of the state it rests in")
    env.close()
