"""CrossQ's pieces against hand computation: batch renormalization, the joint-batch TD loss without a
target network, and which network runs in training mode when."""

from __future__ import annotations

import math

import pytest
import torch

from q2real.agents.algos.crossq import CrossQ, CrossQConfig
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.networks import EnsembleBatchRenorm
from q2real.agents.common.replay import Batch

OBS, ACT, BATCH = 3, 2, 16


def test_batch_renorm_is_batch_norm_during_warmup_then_corrects_towards_the_running_statistics() -> None:
    layer = EnsembleBatchRenorm(1, 2, momentum=0.5, eps=1e-3, r_max=1.5, d_max=0.5, warmup=1)
    x = torch.tensor([[[1.0, 10.0], [3.0, 14.0], [5.0, 12.0], [7.0, 8.0]]])
    mean, var = x.mean(1, keepdim=True), x.var(1, unbiased=False, keepdim=True)
    plain = (x - mean) / (var + 1e-3).sqrt()
    torch.testing.assert_close(layer(x), plain)  # pass 1: warmup, r = 1, d = 0
    running_mean, running_var = 0.5 * mean, 0.5 + 0.5 * var  # lerp from (0, 1) with momentum 0.5
    torch.testing.assert_close(layer.running_mean, running_mean)
    torch.testing.assert_close(layer.running_var, running_var)

    y = x * 2.0  # pass 2: corrected, by hand
    mean_b, var_b = y.mean(1, keepdim=True), y.var(1, unbiased=False, keepdim=True)
    std_b, std = (var_b + 1e-3).sqrt(), (running_var + 1e-3).sqrt()
    r = (std_b / std).clamp(1 / 1.5, 1.5)
    d = ((mean_b - running_mean) / std).clamp(-0.5, 0.5)
    assert (r == 1.5).any() and (d.abs() == 0.5).any(), "the clips must bind for this to test them"
    y.requires_grad_(True)
    out = layer(y)
    torch.testing.assert_close(out, (y - mean_b) / std_b * r + d)
    # r and d are constants to the gradient: it is BatchNorm's gradient scaled by r.
    (out * torch.arange(8.0).view(1, 4, 2)).sum().backward()
    z = y.detach().clone().requires_grad_(True)
    zm, zv = z.mean(1, keepdim=True), z.var(1, unbiased=False, keepdim=True)
    (((z - zm) / (zv + 1e-3).sqrt()) * r * torch.arange(8.0).view(1, 4, 2)).sum().backward()
    torch.testing.assert_close(y.grad, z.grad)

    layer.eval()  # evaluation: the running statistics
    expected = (y - layer.running_mean) / (layer.running_var + 1e-3).sqrt()
    torch.testing.assert_close(layer(y.detach()), expected)
    assert int(layer.steps) == 2


def tiny(**fields) -> CrossQ:
    torch.manual_seed(0)
    config = CrossQConfig(actor_hidden=(8, 8), critic_hidden=(8, 8), batch_size=BATCH, **fields)
    return CrossQ(config, Sizes(OBS, ACT, 1, torch.device("cpu")))


def batch() -> Batch:
    gen = torch.Generator().manual_seed(1)
    return Batch(
        obs=torch.randn(BATCH, OBS, generator=gen),
        action=torch.rand(BATCH, ACT, generator=gen) * 2 - 1,
        reward=torch.randn(BATCH, generator=gen),
        next_obs=torch.randn(BATCH, OBS, generator=gen),
        discount=torch.where(torch.arange(BATCH) % 5 == 0, 0.0, 0.99),
        row=torch.arange(BATCH),
        env=torch.zeros(BATCH, dtype=torch.long),
        cost=torch.zeros(BATCH),
    )


def renorm_means(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([m.running_mean.flatten() for m in module.modules() if isinstance(m, EnsembleBatchRenorm)])


def test_the_td_target_is_the_online_critics_own_value_of_the_next_state_from_one_joint_pass() -> None:
    agent, b = tiny(), batch()
    assert agent.critic_target is None and "critic_target" not in "".join(agent.state_dict())
    alpha = agent.alpha
    # By hand: a' ~ pi(s') with the actor on its running statistics, then Q on [s, s'] x [a, a'] in
    # training mode (one set of batch statistics), y = r + discount (min_i Q_i(s', a') - alpha log pi).
    actor_stats = renorm_means(agent.actor).clone()
    torch.manual_seed(7)
    agent.actor.eval()
    next_action, log_prob = agent.actor.sample(b.next_obs)
    agent.actor.train()
    q = agent.critic(torch.cat([b.obs, b.next_obs]), torch.cat([b.action, next_action])).squeeze(-1).detach()
    y = b.reward + b.discount * (q[:, BATCH:].min(0).values - alpha * log_prob)
    expected = ((q[:, :BATCH] - y) ** 2).mean(1).sum()

    agent2 = tiny()
    torch.manual_seed(7)
    loss, td_abs = agent2.td_loss(b)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(td_abs, (q[:, :BATCH] - y).abs().amax(0))
    assert torch.equal(renorm_means(agent2.actor), actor_stats), (
        "the bootstrap action must not move the actor's statistics"
    )
    # The loss's gradient reaches the critic through the prediction half only: the target is detached.
    loss.backward()
    assert all(p.grad is not None for p in agent2.critic.parameters())


def test_the_actor_step_trains_the_actor_on_batch_statistics_and_reads_the_critic_on_running_ones() -> None:
    agent, b = tiny(), batch()
    agent.critic_update(b)
    critic_stats, actor_stats = renorm_means(agent.critic).clone(), renorm_means(agent.actor).clone()
    agent.actor_update(b.obs)
    assert torch.equal(renorm_means(agent.critic), critic_stats)
    assert not torch.equal(renorm_means(agent.actor), actor_stats)
    assert agent.critic.training and agent.actor.training, "modes are restored after the step"


def test_defaults_are_the_papers_and_bad_settings_are_refused() -> None:
    agent = tiny()
    config = agent.config
    assert (config.policy_delay, config.actor_lr, config.critic_lr) == (3, 1e-3, 1e-3)
    assert agent.critic_optim.param_groups[0]["betas"] == (0.5, 0.999)
    assert all(m.warmup == 100_000 for m in agent.modules() if isinstance(m, EnsembleBatchRenorm))
    assert math.isclose(tiny(renorm_warmup=1000).actor.body[0].warmup, 1000)
    with pytest.raises(ValueError, match=r"crossq.target_network: expected true unless cross_batch is true"):
        CrossQConfig(cross_batch=False).validate("crossq")
    with pytest.raises(ValueError, match=r"crossq.renorm_warmup: expected >= 0"):
        CrossQConfig(renorm_warmup=-1).validate("crossq")
