"""The task's reward rebuilt from what the deploy node streams equals the simulator's, state for state:
one reward definition for simulation and robot."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from q2real.configs.loader import ConfigError
from q2real.sim import make
from q2real.sim.streamed import StreamedState


@pytest.mark.parametrize("name", ["panda_reach", "panda_push", "pendulum_swingup"])
def test_the_reward_from_the_nodes_stream_is_the_simulators(name: str) -> None:
    """Joint states and the observation (the target, the cube from the pose input) are all the node
    has; forward kinematics on this machine's model gives the end effector."""
    env = make(task=name, num_envs=4, device="cpu", backend="mujoco")
    obs = env.reset(seed=3)
    task = env.task
    streamed = StreamedState(task, env.obs_names, env.obs_dims, env.obs_sources)
    held = task.command.clone()
    zero = torch.zeros(4, env.action_dim)

    def joints() -> tuple[np.ndarray, np.ndarray]:
        physics = env.physics
        return physics.qpos[:, task.qpos_index].double().numpy(), physics.qvel[:, task.qvel_index].double().numpy()

    # After a reset the simulator's sensors come from a forward pass on the exact state, as here.
    reward, _ = streamed.reward(*joints(), obs.numpy().astype(np.float64), zero)
    assert torch.allclose(reward, task.reward(env.physics, zero), atol=1e-6)
    gen = torch.Generator().manual_seed(0)
    for _ in range(6):
        action = torch.rand(4, env.action_dim, generator=gen) * 2 - 1
        result = env.step(action)
        reward, terminated = streamed.reward(*joints(), result.next_obs.numpy().astype(np.float64), action)
        # After a step, MuJoCo's sensors are those of the last substep's start: the simulator's end
        # effector lags the joints by one substep (2 ms), the forward pass here does not.
        assert torch.allclose(reward, result.reward, atol=2e-3), (reward, result.reward)
        assert torch.equal(terminated, result.terminated)
    assert torch.equal(task.command, held), "the task's own commands must be left as they were"
    assert result.reward.std() > 0  # different states, different rewards: the comparison can fail


def test_a_task_whose_reward_needs_more_than_the_stream_is_refused() -> None:
    env = make(task="spot_joystick", num_envs=1, device="cpu", backend="mujoco")
    with pytest.raises(ConfigError, match="cannot be computed on the robot.*Task.robot_reward"):
        StreamedState(env.task, env.obs_names, env.obs_dims, env.obs_sources)
