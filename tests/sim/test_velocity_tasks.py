"""The velocity-constrained runners against gymnasium's own v5 envs: same model, same observation,
termination and reward (but for the forward-speed term, measured differently), and Safety-Gymnasium's
cost on the speed."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from q2real.sim import make

CASES = {"hopper_velocity": "Hopper-v5", "walker2d_velocity": "Walker2d-v5", "half_cheetah_velocity": "HalfCheetah-v5"}


@pytest.mark.parametrize("task", sorted(CASES))
def test_a_runner_steps_as_gymnasiums_v5_env_does(task: str) -> None:
    env = make(task=task, num_envs=1, device="cpu", backend="mujoco")
    theirs = gym.make(CASES[task]).unwrapped
    obs = env.reset(seed=3)
    theirs.reset(seed=0)
    rng = np.random.default_rng(0)
    theirs.set_state(env.physics.qpos[0].double().numpy(), env.physics.qvel[0].double().numpy())
    assert np.allclose(obs[0].numpy(), theirs._get_obs(), atol=1e-6)
    for _ in range(30):
        action = rng.uniform(-1, 1, size=env.action_dim)
        result = env.step(torch.as_tensor(action, dtype=torch.float32)[None])
        their_obs, their_reward, their_end, _, info = theirs.step(action)
        assert np.allclose(result.next_obs[0].numpy(), their_obs, atol=1e-4)
        speed = float(result.next_obs[0, env.obs_dims[0]])  # velocity term starts with the root's x velocity
        assert float(result.reward[0]) - speed == pytest.approx(their_reward - info["x_velocity"], abs=1e-4)
        assert bool(result.terminated[0]) == their_end
        # The cost is Safety-Gymnasium's on gymnasium's own speed, wherever the two speeds are not both
        # within a hair of the threshold.
        threshold = env.task.config.velocity_threshold
        if abs(info["x_velocity"] - threshold) > 0.05:
            assert float(result.cost[0]) == float(info["x_velocity"] > threshold)
        if their_end:
            break
