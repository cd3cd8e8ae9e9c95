"""Every registered task on both backends: create, reset, step, shapes, finite values, seeding, auto-reset."""

from __future__ import annotations

import pytest
import torch

from q2real.configs.loader import ConfigError
from q2real.sim import make, task_names
from q2real.sim.registry import TASKS

N, HORIZON = 8, 20
SAME_PHYSICS = {"gr1_joystick": "gr1_legs_stand"}
"""Tasks whose MJX physics (model and substeps) another task's MJX row already compiles and steps: the
task layer is the same torch code on both backends and runs here on native; an XLA compile of the humanoid
is about 100 s of the suite's CPU."""


def _cases() -> list:
    mjx = [pytest.mark.mjx, pytest.mark.timeout(300)]
    cases = [pytest.param(task, "mujoco") for task in task_names()]
    return cases + [pytest.param(task, "mjx", marks=mjx) for task in task_names() if task not in SAME_PHYSICS]


def _actions(env, steps: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(env.num_envs, env.action_dim, generator=gen) * 2 - 1 for _ in range(steps)]


def _roll(env, actions, seed):
    first = env.reset(seed=seed)
    return first, [env.step(a) for a in actions]


@pytest.mark.parametrize(("task", "backend"), _cases())
def test_task_on_backend(task: str, backend: str) -> None:
    if backend == "mjx" and TASKS[task].native_only:
        with pytest.raises(ConfigError, match="native backend only"):
            make(task=task, num_envs=N, backend=backend, device="cpu")
        return
    short = make(task=task, num_envs=N, backend=backend, device="cpu", task_params={"episode_length": HORIZON})
    long = make(task=task, num_envs=N, backend=backend, device="cpu", task_params={"episode_length": 1000})
    actions = _actions(short, HORIZON + 3)
    first, steps = _roll(short, actions, seed=7)
    first_long, steps_long = _roll(long, actions, seed=7)

    assert first.shape == (N, short.obs_dim) and short.obs_dim == sum(short.obs_dims)
    assert len(short.obs_names) == len(short.obs_dims)
    for r in steps:
        assert r.obs.shape == r.next_obs.shape == (N, short.obs_dim)
        assert r.reward.shape == r.cost.shape == r.terminated.shape == r.truncated.shape == (N,)
        assert r.terminated.dtype == r.truncated.dtype == torch.bool
        assert not (r.terminated & r.truncated).any()
        for value in (r.obs, r.next_obs, r.reward, r.cost):
            assert torch.isfinite(value).all()

    # Same seed, same actions: the time limit alone separates the two envs.
    assert torch.equal(first, first_long)
    alive = torch.ones(N, dtype=torch.bool)
    for t in range(HORIZON):
        alive &= ~steps_long[t].terminated
        assert torch.equal(steps[t].next_obs[alive], steps_long[t].next_obs[alive])
    ended = steps[HORIZON - 1]
    assert ended.truncated[alive].all(), "every env still running must be truncated at the time limit"
    # The true last observation survives auto-reset; the obs to act on is a fresh episode's.
    assert torch.equal(ended.next_obs[alive], steps_long[HORIZON - 1].next_obs[alive])
    assert not torch.allclose(ended.obs[alive], ended.next_obs[alive])

    # Seeded determinism: a repeat is identical, another seed is not.
    again_first, again = _roll(short, actions, seed=7)
    assert torch.equal(again_first, first)
    assert all(
        torch.equal(a.next_obs, b.next_obs) and torch.equal(a.reward, b.reward)
        for a, b in zip(again, steps, strict=True)
    )
    other_first, _ = _roll(short, actions, seed=8)
    assert not torch.equal(other_first, first)
    short.close()
    long.close()


def test_the_tasks_left_out_on_mjx_share_their_physics_with_one_that_runs_there() -> None:
    for task, twin in SAME_PHYSICS.items():
        one, other = TASKS[task], TASKS[twin]
        assert one.robot == other.robot and one.scene.__func__ is other.scene.__func__  # the same model
        assert twin not in SAME_PHYSICS and not other.native_only


def test_wrong_action_shape_is_refused() -> None:
    env = make(task="pendulum_swingup", num_envs=2, backend="mujoco", device="cpu")
    env.reset()
    with pytest.raises(ValueError, match=r"action: expected shape \(2, 1\), got \(2, 3\)"):
        env.step(torch.zeros(2, 3))


@pytest.mark.parametrize("task", task_names())
def test_an_env_continues_exactly_from_its_saved_state(task: str) -> None:
    """What a checkpoint holds of the env (physics, commands, pushes, the task's memory) is all it needs:
    a fresh env loaded with it steps as the one that saved it."""
    params = {"episode_length": 12}  # auto-resets inside the window
    saved = make(task=task, num_envs=4, backend="mujoco", device="cpu", task_params=params)
    actions = _actions(saved, 20)
    saved.reset(seed=3)
    for action in actions[:5]:
        saved.step(action)
    state = saved.state_dict()
    fresh = make(task=task, num_envs=4, backend="mujoco", device="cpu", task_params=params)
    fresh.reset(seed=99)
    fresh.load_state_dict(state)
    for action in actions[5:]:
        a, b = saved.step(action), fresh.step(action)
        assert torch.equal(a.next_obs, b.next_obs) and torch.equal(a.reward, b.reward) and torch.equal(a.obs, b.obs)
