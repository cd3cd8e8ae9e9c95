"""Commands that change under a running policy: Spot's joystick draws a fresh command every
`command_every` steps, a share of them zero; the step's reward is paid for the command it was taken
under and the observation shows the new one."""

from __future__ import annotations

import pytest
import torch

from q2real.configs.loader import ConfigError
from q2real.sim import make


def command_slice(env) -> slice:
    start = sum(env.obs_dims[: env.obs_names.index("command")])
    return slice(start, start + env.task.command_dim)


JOYSTICKS = ["spot_joystick", "gr1_joystick"]


@pytest.mark.parametrize("task", JOYSTICKS)
def test_a_joystick_draws_a_fresh_command_every_command_every_steps_and_pays_the_old_one(task: str) -> None:
    env = make(task=task, num_envs=8, device="cpu", backend="mujoco", task_params={"command_every": 3})
    obs = env.reset(seed=0)
    action = torch.zeros(8, env.action_dim)
    first = env.task.command.clone()
    torch.testing.assert_close(obs[:, command_slice(env)], first)
    for _ in range(2):
        result = env.step(action)
        assert torch.equal(env.task.command, first)
    physics_before = env.physics
    result = env.step(action)
    assert not result.done.any(), "standing still for 3 steps must not end an episode"
    new = env.task.command
    assert (new != first).any(dim=-1).sum() >= 6, "every env drew again (zero commands may repeat)"
    torch.testing.assert_close(result.next_obs[:, command_slice(env)], new)
    # The reward of the step was computed under the command it was taken under.
    env.task.command = first
    paid = env.task.reward(env.physics, action)
    env.task.command = new
    torch.testing.assert_close(result.reward, paid)
    assert physics_before is not env.physics


@pytest.mark.parametrize(
    ("task", "ranges"),
    [
        ("spot_joystick", [(-1.0, 1.0), (-0.5, 0.5), (-1.0, 1.0)]),
        ("gr1_joystick", [(-0.5, 1.0), (-0.3, 0.3), (-0.8, 0.8)]),
    ],
)
def test_a_share_of_joystick_commands_is_zero_and_the_rest_fill_their_ranges(task: str, ranges) -> None:
    env = make(task=task, num_envs=1, device="cpu", backend="mujoco")
    commands = env.task.sample_command(20_000, torch.Generator().manual_seed(0))
    zero = (commands == 0).all(-1).float().mean()
    assert 0.09 < float(zero) < 0.11  # zero_command_share 0.1
    for column, (lo, hi) in enumerate(ranges):
        low, high = float(commands[:, column].min()), float(commands[:, column].max())
        assert lo <= low < lo + 0.01 and hi - 0.01 < high <= hi


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"command_every": -1}, r"env.task_params.command_every: expected >= 0"),
        ({"zero_command_share": 1.5}, r"env.task_params.zero_command_share: expected in \[0, 1\], got 1.5"),
    ],
)
def test_bad_command_settings_are_refused_by_name(params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make(task="spot_joystick", num_envs=1, device="cpu", backend="mujoco", task_params=params)
