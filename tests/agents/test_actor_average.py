"""The averaged actor (`actor_average`): its weights and normalization statistics against hand
computation, which actions come from it, and that the bundle runs it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from q2real.agents.algos.crossq import CrossQ, CrossQConfig
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.networks import EnsembleBatchRenorm, average_weights
from q2real.agents.config import TrainConfig
from q2real.agents.export import DeployPolicy, write_bundle
from q2real.agents.learners import build_agent
from q2real.configs.loader import load
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.sim import make

OBS, ACT, BATCH = 3, 2, 16


def test_average_weights_lerps_parameters_and_statistics_and_copies_counters() -> None:
    average, online = EnsembleBatchRenorm(1, 2), EnsembleBatchRenorm(1, 2)
    with torch.no_grad():
        online.scale.fill_(3.0)
        online.running_mean.fill_(2.0)
        online.running_var.fill_(5.0)
        online.steps.fill_(7)
    average_weights(average, online, 0.25)
    torch.testing.assert_close(average.scale, torch.full((1, 1, 2), 0.75 * 1.0 + 0.25 * 3.0))
    torch.testing.assert_close(average.running_mean, torch.full((1, 1, 2), 0.25 * 2.0))
    torch.testing.assert_close(average.running_var, torch.full((1, 1, 2), 0.75 * 1.0 + 0.25 * 5.0))
    assert int(average.steps) == 7
    torch.testing.assert_close(online.scale, torch.full((1, 1, 2), 3.0))  # the online network is left alone


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_each_actor_step_moves_the_average_by_its_rate_and_deterministic_actions_come_from_it(random_batch) -> None:
    torch.manual_seed(0)
    config = CrossQConfig(actor_hidden=(8, 8), critic_hidden=(8, 8), batch_size=BATCH, actor_average=0.25)
    agent = CrossQ(config, Sizes(OBS, ACT, 1, torch.device("cpu")))
    assert agent.policy is agent.actor_average and not agent.actor_average.training
    assert not any(p.requires_grad for p in agent.actor_average.parameters())
    assert all(torch.equal(agent.actor_average.state_dict()[k], v) for k, v in state(agent.actor).items())
    expected = state(agent.actor_average)
    b = random_batch(BATCH, OBS, ACT, 1)
    for _ in range(4):  # policy delay 3: actor steps after the 1st and 4th critic steps
        before = state(agent.actor)
        agent.update(b)
        if state(agent.actor)["body.0.scale"].ne(before["body.0.scale"]).any():
            after = state(agent.actor)
            for key, value in after.items():
                expected[key] = torch.lerp(expected[key], value, 0.25) if value.is_floating_point() else value
    assert agent.updates == 4
    got = state(agent.actor_average)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, msg=key)
    assert not torch.equal(got["body.0.scale"], state(agent.actor)["body.0.scale"])

    obs = torch.randn(5, OBS)
    with torch.no_grad():
        averaged = agent.actor_average(agent.obs_norm(obs))
        agent.actor.eval()
        online = agent.actor(agent.obs_norm(obs))
        torch.manual_seed(3)
        explored = agent.explore(agent.obs_norm(obs))
        agent.actor.train()
    torch.testing.assert_close(agent.act(obs, deterministic=True), averaged)
    torch.testing.assert_close(agent.act(obs, deterministic=True, averaged=False), online)
    assert not torch.allclose(averaged, online)
    torch.manual_seed(3)
    torch.testing.assert_close(agent.act(obs), explored)  # exploration stays with the online actor
    assert agent.actor.training and not agent.actor_average.training, "modes are restored"


def test_the_bundle_runs_the_averaged_actor(tmp_path: Path, random_batch) -> None:
    config = load(TrainConfig, None, ["algo=crossq", "crossq.actor_average=0.5", "env.num_envs=1"])
    env = make(config.env)
    try:
        agent = build_agent(config, env)
        b = random_batch(BATCH, env.obs_dim, env.action_dim, 1)
        for _ in range(4):
            agent.update(b)
        path = write_bundle(config, env, agent, 0, tmp_path / "policy.onnx")
        obs = torch.randn(8, env.policy_obs_dim)
        deploy, online_deploy = DeployPolicy(agent, env).eval(), DeployPolicy(agent, env).eval()
        online_deploy.policy[1] = agent.actor  # the same graph around the online actor
        with torch.no_grad():
            averaged, online = deploy(obs).numpy(), online_deploy(obs).numpy()
        bundle = PolicyBundle(path)(obs.numpy())
        assert np.abs(bundle - averaged).max() < 1e-5
        assert np.abs(bundle - online).max() > 1e-3
    finally:
        env.close()


def test_a_rate_outside_zero_to_one_is_refused_naming_the_key() -> None:
    with pytest.raises(Exception, match=r"crossq\.actor_average: expected in \[0, 1\], got 1\.5"):
        load(TrainConfig, None, ["algo=crossq", "crossq.actor_average=1.5"])
