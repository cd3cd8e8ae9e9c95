"""Constrained learners' pieces against hand computations and their stated bounds: the quantile-Huber
loss, truncation, the Lagrange multiplier, COX-Q's projection and trust-region step."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from q2real.agents.algos.coxq import COXQ, COXQConfig
from q2real.agents.algos.sac_lag import SACLag, SACLagConfig
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.heads import QuantileHead
from q2real.agents.common.lagrange import EpisodeCost, Lagrange
from q2real.agents.common.optimistic import (
    CASES,
    FEASIBLE,
    FREE,
    ONTO_BOTH,
    project_to_cone,
    sigma_dot,
    trust_region_step,
)
from q2real.sim.vec_env import StepResult


def test_quantile_huber_loss_matches_a_hand_computation() -> None:
    head = QuantileHead(num_quantiles=2)  # taus 1/4 and 3/4
    out = torch.tensor([[[0.0, 2.0]]])  # one member, one sample
    target_out = torch.tensor([[[1.0, 3.0]]])  # reward 0, discount 1: target atoms 1 and 3
    loss, td = head.loss(out, target_out, torch.zeros(1), torch.ones(1), torch.zeros(1))
    # theta=0: u = 1, 3 -> |0.25 - 0| (0.5, 2.5) -> mean 0.375
    # theta=2: u = -1, 1 -> (|0.75 - 1| 0.5 + |0.75 - 0| 0.5) / 2 = 0.25
    assert loss.item() == pytest.approx(0.375 + 0.25)
    assert td.item() == pytest.approx(abs(1.0 - 2.0))


def test_targets_pool_every_member_and_truncation_removes_the_right_tail() -> None:
    target_out = torch.tensor([[[5.0, 1.0, 3.0]], [[0.0, 9.0, 2.0]]])  # two members, one sample
    assert QuantileHead(3).target_atoms(target_out).tolist() == [[0.0, 1.0, 2.0, 3.0, 5.0, 9.0]]
    # drop_top=1 removes one atom per member from the top of the pooled, sorted target.
    assert QuantileHead(3, drop_top=1).target_atoms(target_out).tolist() == [[0.0, 1.0, 2.0, 3.0]]


def test_the_cost_tail_leaves_out_the_optimistic_quantiles() -> None:
    agent = COXQ(dataclasses.replace(COXQConfig(), num_quantiles=4, cost_tail=0.5), Sizes(3, 2, 1, torch.device("cpu")))
    atoms = torch.tensor([0.0, 1.0, 10.0, 20.0])
    assert (
        agent.cost_critic.head.upper_tail(atoms.expand(5, 1, 4), agent.cost_critic.tail_start).tolist() == [[15.0]] * 5
    )


def test_lambda_rises_while_the_cost_is_over_the_limit_and_falls_back_to_zero_under_it() -> None:
    lam = Lagrange(limit=25.0, init=0.0, lr=0.01, max_value=10.0)
    for _ in range(10):
        lam.update(torch.tensor(35.0))
    assert lam.value.item() == pytest.approx(1.0)  # steps in proportion to the violation: 10 x 0.01 x 10
    lam.update(torch.tensor(30.0))
    assert lam.value.item() == pytest.approx(1.05)
    for _ in range(100):
        lam.update(torch.tensor(0.0))
    assert lam.value.item() == 0.0  # projected onto lambda >= 0
    for _ in range(1000):
        lam.update(torch.tensor(1e6))
    assert lam.value.item() == 10.0  # and onto its maximum


def test_a_cost_limit_of_zero_raises_lambda_without_nan() -> None:
    lam = Lagrange(limit=0.0, init=0.0, lr=0.1, max_value=100.0)
    lam.update(torch.tensor(0.0))
    assert lam.value.item() == 0.0  # no cost paid: nothing to push against
    lam.update(torch.tensor(3.0))
    assert lam.value.item() == pytest.approx(0.3)
    assert torch.isfinite(lam.value)


def test_lambda_waits_for_a_first_episode() -> None:
    cost = EpisodeCost(num_envs=2, rate=0.5)
    lam = Lagrange(limit=1.0, init=0.5, lr=1.0, max_value=10.0)
    step = _step(cost=[1.0, 0.0], done=[False, False])
    cost.update(step)
    lam.update(cost.average, cost.seen)
    assert lam.value.item() == 0.5 and not cost.seen
    cost.update(_step(cost=[2.0, 4.0], done=[True, True]))  # episodes of cost 3 and 4 end together
    assert cost.average.item() == pytest.approx(0.25 * 3.5 + 0.75 * 3.5)  # the first sets it: their mean
    cost.update(_step(cost=[1.0, 0.0], done=[True, False]))  # cost 1
    assert cost.average.item() == pytest.approx(0.5 * 3.5 + 0.5 * 1.0)
    cost.update(_step(cost=[2.0, 6.0], done=[True, True]))  # two more: costs 2 and 0 + 6, mean 4
    assert cost.average.item() == pytest.approx(0.25 * 2.25 + 0.75 * 4.0)  # as two updates by their mean


def _step(cost: list[float], done: list[bool]) -> StepResult:
    n = len(cost)
    zeros = torch.zeros(n, 1)
    return StepResult(
        zeros, zeros, torch.zeros(n), torch.tensor(done), torch.zeros(n, dtype=torch.bool), torch.tensor(cost)
    )


def _random_problem(seed: int, batch: int = 512, dim: int = 4, scale: float = 1.0, std: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    v, g_r, g_c = (scale * torch.randn(batch, dim, generator=gen, dtype=torch.float64) for _ in range(3))
    var = std**2 * (torch.rand(batch, dim, generator=gen, dtype=torch.float64) * 4 + 0.01)  # tiny to wide
    return v, g_r, g_c, var


# Gradient scales and policy stds as a converging policy meets them: small gradients, narrow Gaussians.
SCALES = [(1.0, 1.0), (0.1, 1.0), (0.1, 0.1), (1e-3, 0.05)]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("scale", "std"), SCALES)
def test_the_projection_satisfies_both_half_spaces_and_is_the_nearest_such_point(seed, scale, std) -> None:
    v, g_r, g_c, var = _random_problem(seed, scale=scale, std=std)
    x, case = project_to_cone(v, g_r, g_c, var)
    unit = (sigma_dot(v, v, var) * sigma_dot(g_r, g_r, var)).sqrt()  # the size of <v, g>_Sigma here
    tol = 1e-6 * unit
    assert (sigma_dot(x, g_r, var) >= -tol).all() and (sigma_dot(x, g_c, var) >= -tol).all()
    assert torch.equal(x[case == FEASIBLE], v[case == FEASIBLE])
    assert {int(c) for c in case.unique()} >= {FEASIBLE, ONTO_BOTH}, "a random batch exercises every case"
    # Optimality (KKT of min ||x - v||_Sigma^2 over the cone): x - v = a g_r + b g_c with a, b >= 0,
    # each zero unless its constraint is active.
    basis = torch.stack([g_r, g_c], dim=-1)
    weights = torch.linalg.lstsq(basis, (x - v)[..., None]).solution.squeeze(-1)
    residual = (basis @ weights[..., None]).squeeze(-1) - (x - v)
    assert (residual.abs().amax(-1) <= 1e-6 * v.abs().amax(-1)).all()
    assert (weights >= -1e-6).all()
    slack = torch.stack([sigma_dot(x, g_r, var), sigma_dot(x, g_c, var)], dim=-1)
    assert ((weights * slack).abs().amax(-1) <= 1e-5 * unit * (weights.abs().amax(-1) + 1)).all()


def test_the_projection_holds_in_float32_at_small_scales() -> None:
    v, g_r, g_c, var = (t.float() for t in _random_problem(0, scale=1e-2, std=0.1))
    x, case = project_to_cone(v, g_r, g_c, var)
    unit = (sigma_dot(v, v, var) * sigma_dot(g_r, g_r, var)).sqrt()
    projected = case != FEASIBLE
    assert projected.sum() > 100
    for g in (g_r, g_c):
        assert (sigma_dot(x, g, var) >= -1e-4 * unit).all()


@pytest.mark.parametrize("seed", range(3))
def test_the_trust_region_step_keeps_the_kl_radius_and_the_cost_slack(seed: int) -> None:
    v, cost_grad, _, var = _random_problem(seed)
    delta = torch.tensor(0.7, dtype=torch.float64)
    slack = torch.randn(v.shape[0], dtype=torch.float64)
    step, cut = trust_region_step(v, cost_grad, var, delta, slack)
    kl = 0.5 * (step.pow(2) / var).sum(-1)  # KL between Gaussians of one covariance, means `step` apart
    assert (kl <= 0.5 * delta**2 + 1e-9).all()
    assert torch.allclose(kl[~cut], torch.full_like(kl[~cut], 0.5 * delta.item() ** 2), rtol=1e-4)  # full radius
    rise = (cost_grad * step).sum(-1)  # first-order cost change of the mean shift
    assert (rise <= slack.clamp(min=0) + 1e-9).all()
    assert cut.any() and (~cut).any()


def _agents(config_type, algo_type, **overrides):
    config = dataclasses.replace(config_type(), actor_hidden=(16,), critic_hidden=(16,), **overrides)
    return algo_type(config, Sizes(3, 2, 4, torch.device("cpu")))


def test_coxq_explores_inside_the_action_box_and_counts_every_state() -> None:
    agent = _agents(COXQConfig, COXQ, num_quantiles=8)
    obs = torch.randn(64, 3)
    action = agent.act(obs)
    assert action.shape == (64, 2) and torch.isfinite(action).all() and action.abs().max() <= 1
    assert agent.case_counts[: len(CASES)].sum().item() == 64
    assert agent.case_counts[FREE].item() == 64  # an untrained cost critic leaves slack everywhere


def test_out_of_slack_coxq_projects_and_never_steps_up_the_linearised_cost() -> None:
    agent = _agents(COXQConfig, COXQ, num_quantiles=8, cost_limit=0.0)
    with torch.no_grad():
        agent.cost_critic.critic.head.bias.fill_(1.0)  # Q_c near 1 everywhere: over the limit of 0
    torch.manual_seed(0)
    agent.act(torch.randn(256, 3))
    counts = agent.case_counts
    assert counts[FREE].item() == 0 and counts[: len(CASES)].sum().item() == 256
    assert counts[FREE + 1 : len(CASES)].sum() == 256  # every state resolved the conflict by a case
    assert counts[len(CASES)].item() > 0  # and the slack cut the steps that raise the cost


def test_the_trust_region_shrinks_while_training_cost_runs_over_budget_and_grows_under_it() -> None:
    agent = _agents(COXQConfig, COXQ, num_quantiles=8, cost_limit=5.0, limit_horizon=100, training_cost_rate=1.0)
    start = agent.delta.item()
    for cost in (1.0, 1.0, 1.0):  # 100 x 1 per step, budget 5
        agent.act(torch.randn(4, 3))
        agent.observe(_result(cost))
    assert agent.delta.item() < start
    low = agent.delta.item()
    agent.act(torch.randn(4, 3))
    agent.observe(_result(0.0))
    assert agent.delta.item() > low


def _result(cost: float) -> StepResult:
    obs = torch.zeros(4, 3)
    no = torch.zeros(4, dtype=torch.bool)
    return StepResult(obs, obs, torch.zeros(4), no, no, torch.full((4,), cost))


def test_sac_lag_charges_the_actor_the_cost_and_divides_by_one_plus_lambda() -> None:
    agent = _agents(SACLagConfig, SACLag)
    obs, action, log_prob = torch.randn(8, 3), torch.rand(8, 2) * 2 - 1, torch.randn(8)
    plain = super(SACLag, agent).actor_objective(obs, action, log_prob)
    agent.lagrange.value.fill_(3.0)
    charged = agent.actor_objective(obs, action, log_prob)
    torch.testing.assert_close(charged, (plain + 3.0 * agent.cost_critic.q(obs, action).mean(0)) / 4.0)


def test_coxq_weighs_the_cost_by_the_rectified_multiplier() -> None:
    agent = _agents(COXQConfig, COXQ, num_quantiles=8, rectify=10.0)
    obs, action, log_prob = torch.randn(8, 3), torch.rand(8, 2) * 2 - 1, torch.randn(8)
    plain = super(SACLag, agent).actor_objective(obs, action, log_prob)
    cost = agent.cost_values(obs, action)
    for lam in (0.0, 0.5, 3.0):
        agent.lagrange.value.fill_(lam)
        weight = max(0.0, lam + 10.0 * (cost.mean().item() - agent.value_limit))
        torch.testing.assert_close(agent.actor_objective(obs, action, log_prob), plain + weight * cost)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo=sac_lag", "pql.enabled=true"], "pql.enabled"),
        (["algo=sac_lag", "sac_lag.cost_limit=-1"], "sac_lag.cost_limit"),
        (["algo=sac_lag", "sac_lag.chunk.size=4"], "sac_lag.chunk.size"),
        (["algo=coxq", "coxq.network=flash", "coxq.actor_hidden=[64]", "coxq.critic_hidden=[64]"], "coxq.network"),
        (["algo=coxq", "coxq.num_cost_critics=1"], "coxq.num_cost_critics"),
        (["algo=coxq", "coxq.critic_head=scalar"], "coxq.critic_head"),
        (["algo=coxq", "coxq.cost_tail=0.01"], "coxq.cost_tail"),
    ],
)
def test_settings_a_constrained_learner_cannot_honour_are_refused_by_name(overrides, message) -> None:
    from q2real.agents.config import TrainConfig
    from q2real.configs.loader import load

    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        load(TrainConfig, None, overrides).validate()
