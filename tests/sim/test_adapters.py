"""gymnasium and MuJoCo Playground envs behind the same API, keeping the true last observation."""

from __future__ import annotations

import pytest
import torch

from q2real.configs.errors import MissingDependency
from q2real.sim import make


def _paired_rollout(task: str, limit_key: str, backend: str, num_envs: int = 3, steps: int = 6):
    short = make(task=task, num_envs=num_envs, backend=backend, device="cpu", task_params={limit_key: 5})
    long = make(task=task, num_envs=num_envs, backend=backend, device="cpu", task_params={limit_key: 50})
    assert torch.equal(short.reset(seed=0), long.reset(seed=0))
    gen = torch.Generator().manual_seed(0)
    pairs = []
    for _ in range(steps):
        action = torch.rand(num_envs, short.action_dim, generator=gen) * 2 - 1
        pairs.append((short.step(action), long.step(action)))
    return pairs


def _check_time_limit(pairs) -> None:
    for t, (a, b) in enumerate(pairs[:5]):
        assert torch.allclose(a.next_obs, b.next_obs, atol=1e-6)
        assert a.truncated.all() == (t == 4)
    ended = pairs[4][0]
    assert not torch.allclose(ended.obs, ended.next_obs)


def test_gymnasium_classic_env_keeps_final_obs() -> None:
    _check_time_limit(_paired_rollout("gymnasium:Pendulum-v1", "max_episode_steps", "auto"))


def test_gymnasium_mujoco_v5_env_runs() -> None:
    env = make(task="gymnasium:InvertedPendulum-v5", num_envs=4, device="cpu")
    assert env.reset(seed=0).shape == (4, 4) and env.action_dim == 1
    result = env.step(torch.ones(4, 1))
    assert torch.isfinite(result.next_obs).all() and result.reward.shape == (4,)
    env.close()


def test_gymnasium_refuses_discrete_actions_and_mjx() -> None:
    with pytest.raises(ValueError, match="needs a Box action space"):
        make(task="gymnasium:CartPole-v1", num_envs=2)
    with pytest.raises(ValueError, match="steps its own simulator"):
        make(task="gymnasium:Pendulum-v1", num_envs=2, backend="mjx")


@pytest.mark.mjx
@pytest.mark.timeout(300)
def test_playground_dm_control_env_keeps_final_obs() -> None:
    _check_time_limit(_paired_rollout("playground:CartpoleSwingup", "episode_length", "auto"))


@pytest.mark.slow  # the first Playground import brings JAX up: about 6 s on a loaded 2-core machine
def test_playground_robot_env_without_menagerie_says_why() -> None:
    with pytest.raises(MissingDependency, match="needs MuJoCo Menagerie at .*DM Control suite envs need no download"):
        make(task="playground:Go1JoystickFlatTerrain", num_envs=2)


def test_unknown_adapter_and_playground_name() -> None:
    with pytest.raises(ValueError, match="unknown adapter 'brax:'"):
        make(task="brax:ant")
    with pytest.raises(ValueError, match="is not a Playground env"):
        make(task="playground:NoSuchEnv")
