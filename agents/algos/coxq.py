"""COX-Q, Constrained Optimistic eXploration Q-learning (Li, Spaan & Kooij, ICLR 2026).

SAC-Lagrangian keeps the cost of the final policy under its limit; COX-Q also keeps low the cost paid
while learning, which on a robot is damage. Its pieces, on top of SAC-Lag:
  - quantile ensembles for reward and cost (`QuantileHead`: quantile-Huber, pooled targets); the cost
    is priced by the upper tail of its quantiles, the optimistic low-cost ones left out;
  - the cost backup bootstraps from the deterministic next action;
  - a rectified cost weight max(0, lambda + rectify (Q_c - d_Q)): the actor stops trading reward for
    cost while the batch's cost estimate sits below the per-state limit d_Q, and pays more above it;
  - optimistic exploration (`q2real.agents.common.optimistic`): the rollout mean moves along the reward
    UCB and against the cost LCB, projected when they conflict, within a KL trust region whose size
    delta shrinks while the training cost runs over its budget.
The per-state limit is SAC-Lag's d_Q (`value_limit`). COX-Q's code compares Q_c with d / 10
and updates lambda on a critic estimate with Adam; here lambda follows SAC-Lag's rule on the episode
cost, so the two learners differ only in what COX-Q adds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from q2real.agents.algos.sac_lag import SACLag, SACLagConfig
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.heads import QuantileHead
from q2real.agents.common.optimistic import CASES, FREE, project_to_cone, trust_region_step
from q2real.sim.vec_env import StepResult


@dataclass
class COXQConfig(SACLagConfig):
    gamma: float = 0.975
    num_critics: int = 5
    num_cost_critics: int = 5
    critic_head: Literal["scalar", "categorical", "quantile"] = "quantile"
    num_quantiles: int = 32
    actor_uses_mean_q: bool = True
    """COX-Q's actor takes the mean of every reward atom, no minimum."""
    policy_delay: int = 2
    cost_tail: float = 0.5
    """Share of each cost member's quantiles, from the top, that price the cost (COX-Q: the upper half)."""
    rectify: float = 10.0
    """Slope of the rectified cost weight max(0, lambda + rectify (Q_c - d_Q)): how steeply the actor's
    price of cost follows the batch's cost estimate Q_c around the per-state limit d_Q."""
    optimism: float = 3.0
    """beta of the bounds: reward mean + beta std, cost mean - beta std, over the ensemble."""
    trust_region: float = 4.0
    """delta at the start; KL per exploring step <= delta^2 / 2."""
    trust_region_min: float = 0.05
    """Smallest delta: the trust region shrinks towards it while the training cost runs over its budget."""
    trust_region_max: float = 6.0
    """Largest delta: the trust region grows back towards it while the training cost stays under budget."""
    trust_region_lr: float = 1e-3
    """delta's step per env step and unit of training cost over the budget, relative to the budget."""
    training_cost_budget: float | None = None
    """Episode cost that exploration may run at; None: the cost limit."""
    training_cost_rate: float = 0.01
    """Weight of each step in the running per-step training cost."""

    def checks(self) -> list[tuple[bool, str, str]]:
        budget = self.training_cost_budget
        return [
            *super().checks(),
            (self.critic_head == "quantile", "critic_head", "quantile"),
            (self.num_critics >= 2, "num_critics", ">= 2 (the bounds use the ensemble's spread)"),
            (self.num_cost_critics >= 2, "num_cost_critics", ">= 2 (the bounds use the ensemble's spread)"),
            (round(self.cost_tail * self.num_quantiles) >= 1, "cost_tail", "in (0, 1], one quantile or more"),
            (self.cost_tail <= 1, "cost_tail", "in (0, 1]"),
            (0 <= self.rectify < math.inf, "rectify", ">= 0 and finite"),
            (0 <= self.optimism < math.inf, "optimism", ">= 0 and finite"),
            (
                0 < self.trust_region_min <= self.trust_region <= self.trust_region_max < math.inf,
                "trust_region",
                "in [trust_region_min, trust_region_max], min > 0",
            ),
            (0 < self.trust_region_lr < math.inf, "trust_region_lr", "> 0 and finite"),
            (budget is None or 0 <= budget < math.inf, "training_cost_budget", ">= 0 and finite, or null"),
            (0 < self.training_cost_rate <= 1, "training_cost_rate", "in (0, 1]"),
            (not self.noise_repeat, "noise_repeat", "false: COX-Q chooses its own exploration"),
            # Exploring runs the critics on rollout states: BatchNorm would learn their statistics.
            (self.network != "flash", "network", "mlp or layernorm (the flash trunk's BatchNorm)"),
        ]


class COXQ(SACLag):
    config: COXQConfig
    cost_estimate = "upper quantile tail, ensemble mean"
    delta: torch.Tensor
    step_cost: torch.Tensor
    case_counts: torch.Tensor
    slack_sum: torch.Tensor

    def __init__(self, config: COXQConfig, sizes: Sizes):
        super().__init__(config, sizes)
        budget = config.cost_limit if config.training_cost_budget is None else config.training_cost_budget
        self.budget = budget
        self.register_buffer("delta", torch.tensor(config.trust_region, device=sizes.device))
        self.register_buffer("step_cost", torch.zeros((), device=sizes.device))
        # Per case (and a last entry for steps the cost cap cut), states since the last log window.
        self.register_buffer("case_counts", torch.zeros(len(CASES) + 1, device=sizes.device))
        self.register_buffer("slack_sum", torch.zeros((), device=sizes.device))
        """d_Q - Q_c of the exploring states since the last log window, summed."""
        self._explored = False

    def cost_head(self) -> tuple[QuantileHead, int]:
        cfg = self.config
        return QuantileHead(cfg.num_quantiles), cfg.num_quantiles - round(cfg.cost_tail * cfg.num_quantiles)

    def cost_target_action(self, next_obs: torch.Tensor) -> torch.Tensor:
        return self.actor(next_obs)

    def actor_objective(self, obs: torch.Tensor, action: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
        cost = self.cost_values(obs, action)
        weight = (self.lagrange.value + self.config.rectify * (cost.detach().mean() - self.value_limit)).clamp(min=0)
        return super(SACLag, self).actor_objective(obs, action, log_prob) + weight * cost

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        mean, log_std = self.actor.distribution(obs)
        std = log_std.exp()
        var = std.pow(2)
        with torch.enable_grad():
            mu = mean.detach().requires_grad_(True)
            action = torch.tanh(mu)
            reward_atoms = self.critic(obs, action)  # (E, B, N)
            cost_atoms = self.cost_critic.critic(obs, action)[..., self.cost_critic.tail_start :]
            ucb = (reward_atoms.mean(0) + cfg.optimism * reward_atoms.std(0)).mean(-1)
            lcb = (cost_atoms.mean(0) - cfg.optimism * cost_atoms.std(0)).mean(-1)
            cost = cost_atoms.mean((0, -1))
            g_r, g_lcb, h = (torch.autograd.grad(f.sum(), mu, retain_graph=True)[0] for f in (ucb, lcb, cost))
        g_c = -g_lcb
        cost = cost.detach()
        slack = self.value_limit - cost
        lam = (self.lagrange.value + cost - self.value_limit).clamp(min=0)
        v = g_r + lam[:, None] * g_c
        projected, case = project_to_cone(v, g_r, g_c, var)
        free = slack > 0
        v = torch.where(free[:, None], v, projected)
        case = torch.where(free, FREE, case)
        step, cut = trust_region_step(v, h, var, self.delta, slack)
        counts = nn.functional.one_hot(case, len(CASES)).sum(0)  # bincount would sync a GPU for its size
        self.case_counts += torch.cat([counts, cut.sum()[None]])
        self.slack_sum += slack.sum()
        self._explored = True
        return torch.tanh(mean + step + std * torch.randn_like(mean))

    def on_step(self, result: StepResult) -> None:
        super().on_step(result)
        if not self._explored:  # random warm-up actions say nothing about the exploration's cost
            return
        cfg = self.config
        self.step_cost.lerp_(self.gather(result.cost).mean(), cfg.training_cost_rate)
        over = (cfg.limit_horizon * self.step_cost - self.budget) / max(self.budget, 1.0)
        self.delta.copy_((self.delta - cfg.trust_region_lr * over).clamp(cfg.trust_region_min, cfg.trust_region_max))
        self._explored = False

    def metrics(self) -> dict[str, torch.Tensor]:
        counts = self.case_counts[: len(CASES)]
        shares = self.case_counts / counts.sum().clamp(min=1)
        names = [f"explore_{name}" for name in (*CASES, "cost_cut")]
        out = super().metrics() | dict(zip(names, shares.clone(), strict=True))
        out["explore_slack"] = self.slack_sum / counts.sum().clamp(min=1)
        self.case_counts.zero_()
        self.slack_sum.zero_()
        return out | {"trust_region": self.delta.clone(), "training_step_cost": self.step_cost.clone()}
