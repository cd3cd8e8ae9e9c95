"""Asymmetric actor-critic (`env.task_params.critic_terms`): the critics see true state the robot has
no sensor for, the actor and the bundle only the policy's observation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from q2real.agents.config import TrainConfig
from q2real.agents.export import DeployPolicy, export_run, load_run_policy
from q2real.agents.learners import build_agent
from q2real.agents.train import Trainer, train
from q2real.configs.loader import ConfigError, load
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.gate.evaluation import evaluate_run
from q2real.residual.base_env import BaseActionEnv
from q2real.sim import RandomizationConfig, make


def spot():
    task_params = {"critic_terms": True, "observe_last_action": True}
    noisy = RandomizationConfig(obs_noise_std=0.05)
    return make(
        task="spot_joystick", num_envs=4, device="cpu", backend="mujoco", task_params=task_params, randomization=noisy
    )


def test_critic_columns_follow_the_noisy_policy_observation_and_hold_the_exact_base_state() -> None:
    env = spot()
    plain = make(
        task="spot_joystick", num_envs=4, device="cpu", backend="mujoco", task_params={"observe_last_action": True}
    )
    assert env.critic_names == ("base_linear_velocity", "base_height")
    assert env.policy_obs_dim == plain.obs_dim and env.obs_dim == plain.obs_dim + 4
    assert env.obs_names == plain.obs_names, "the bundle's terms are the policy's alone"
    env.reset(seed=0)
    action = torch.linspace(-0.5, 0.5, env.action_dim).repeat(4, 1)
    for _ in range(5):
        result = env.step(action)
    task, physics = env.task, env.physics
    critic = result.next_obs[:, env.policy_obs_dim :]
    torch.testing.assert_close(critic[:, :3], task.base_linear_velocity(physics), rtol=0, atol=0)
    torch.testing.assert_close(critic[:, 3], task.base_height(physics), rtol=0, atol=0)
    noise = result.next_obs[:, : env.policy_obs_dim] - task.observe(physics)
    assert float(noise.std()) == pytest.approx(0.05, rel=0.2), "the policy's columns carry the sensor noise"


def test_a_task_without_critic_terms_refuses_the_setting_by_name() -> None:
    with pytest.raises(ConfigError, match=r"env.task_params.critic_terms: task 'panda_reach' has no critic-only terms"):
        make(task="panda_reach", num_envs=1, device="cpu", backend="mujoco", task_params={"critic_terms": True})


def small(tmp_path: Path, *extra: str) -> TrainConfig:
    return load(
        TrainConfig,
        None,
        [
            "env.task=spot_joystick",
            "env.num_envs=2",
            "env.task_params.episode_length=20",
            "env.task_params.critic_terms=true",
            *(extra or ["algo=crossq"]),
            "total_steps=120",
            "warmup_steps=40",
            "eval_every=0",
            "eval_envs=2",
            f"log.root={tmp_path}",
        ],
    )


@pytest.mark.slow  # trains, exports and evaluates a bundle both ways
def test_the_actor_reads_only_the_policy_columns_and_the_bundle_takes_only_them(tmp_path: Path) -> None:
    run = train(small(tmp_path)).path
    config, env, agent, _ = load_run_policy(run)
    env.close()
    policy, full = agent.policy_obs_dim, agent.obs_dim
    assert (policy, full) == (env.policy_obs_dim, env.obs_dim) and full == policy + 4
    obs = torch.randn(64, full)
    moved = obs.clone()
    moved[:, policy:] += 3.0
    assert torch.equal(agent.act(obs, deterministic=True), agent.act(moved, deterministic=True))
    action = agent.act(obs, deterministic=True)
    assert not torch.equal(agent.critic(agent.obs_norm(obs), action), agent.critic(agent.obs_norm(moved), action))

    bundle = PolicyBundle(export_run(run))
    assert bundle.info.obs_dim == policy and bundle.info.metadata["io"]["input"]["shape"] == ["batch", policy]
    raw = obs[:, :policy].numpy()
    with torch.no_grad():
        expected = DeployPolicy(agent, env)(obs[:, :policy]).numpy()
    assert np.abs(bundle(raw) - expected).max() < 1e-5
    # The gate feeds the bundle the policy's columns of the same episodes the torch policy saw.
    from_torch = evaluate_run(run, episodes=2, seed=3)
    from_bundle = evaluate_run(run, episodes=2, seed=3, bundle=run / "policy.onnx")
    torch.testing.assert_close(from_torch, from_bundle, rtol=1e-4, atol=1e-3)
    del config


def test_what_sees_only_the_robots_observation_refuses_critic_terms(tmp_path: Path) -> None:
    config = small(tmp_path, "algo=sac_lag")
    with pytest.raises(ConfigError, match=r"env.task_params.critic_terms: sac_lag's cost critic, which the deploy"):
        build_agent(config, spot())
    with pytest.raises(ConfigError, match=r"env.task_params.critic_terms: a residual over a base policy uses only"):
        BaseActionEnv(spot(), nn.Identity(), 12)


def test_the_critics_see_each_robots_draw_which_follows_a_curriculum_and_the_policy_does_not() -> None:
    """Hand-set ranges whose every draw is known: 20 % more mass everywhere, half the friction, 0.7 of
    the actuator gain with Kp at 1.1 (0.77 together), Kd 0.9, 2 ticks of latency, and 1.5 times a joint
    damping Spot's model does not have (no change to see); at half strength each scale is halfway and
    the latency rounds to 1."""
    ranges = RandomizationConfig(
        mass_scale=(1.2, 1.2), friction_scale=(0.5, 0.5), actuator_gain_scale=(0.7, 0.7), kp_scale=(1.1, 1.1),
        kd_scale=(0.9, 0.9), damping_scale=(1.5, 1.5), action_latency=(2, 2),
    )  # fmt: skip
    params = {"critic_dynamics": True, "observe_last_action": True}
    env = make(
        task="spot_joystick", num_envs=3, device="cpu", backend="mujoco", task_params=params, randomization=ranges
    )
    plain = make(task="spot_joystick", num_envs=3, device="cpu", backend="mujoco", randomization=ranges,
                 task_params={"observe_last_action": True})  # fmt: skip
    assert env.critic_names == ("dynamics",) and env.critic_dims == (6,) and env.policy_obs_dim == plain.obs_dim
    full = torch.tensor([2.0, 0.2, -0.5, 0.77 - 1, 0.9 - 1, 0.0])
    obs = env.reset(seed=0)
    torch.testing.assert_close(obs[:, env.policy_obs_dim :], full.expand(3, 6), rtol=0, atol=1e-6)
    assert torch.equal(obs[:, : env.policy_obs_dim], plain.reset(seed=0)), "the policy's columns are as without"
    env.set_randomization_strength(0.5)
    half = torch.tensor([1.0, 0.1, -0.25, 0.85 * 1.05 - 1, -0.05, 0.0])  # gain and Kp each halfway
    step = env.step(torch.zeros(3, env.action_dim))
    torch.testing.assert_close(step.next_obs[:, env.policy_obs_dim :], half.expand(3, 6), rtol=0, atol=1e-6)
    # Judged on the nominal robot (the gate's nominal row, a fine-tuning env without a shift), the
    # columns say so: zeros.
    nominal = make(task="spot_joystick", num_envs=1, device="cpu", backend="mujoco", task_params=params)
    assert torch.equal(nominal.reset(seed=0)[:, nominal.policy_obs_dim :], torch.zeros(1, 6))
    for e in (env, plain, nominal):
        e.close()


def test_training_critics_on_a_draw_of_nothing_is_refused_by_name(tmp_path: Path) -> None:
    config = small(tmp_path, "algo=crossq", "env.task_params.critic_dynamics=true", "env.randomization.com_offset=0.01")
    with pytest.raises(ConfigError, match=r"env.task_params.critic_dynamics: env.randomization draws no robot"):
        Trainer(config)
