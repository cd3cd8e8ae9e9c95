"""SAC-Lagrangian: SAC under an episode-cost constraint E[sum of costs] <= d (Ha et al. 2020; OmniSafe's
SAC-Lag), the baseline COX-Q is measured against.

A cost critic Q_c is trained beside the reward critics on the replay's costs, and the actor minimises
(alpha log pi - Q + lambda Q_c) / (1 + lambda): dividing by 1 + lambda keeps the actor's step size from
growing with the multiplier. lambda follows the dual rule of `q2real.agents.common.lagrange` on the
episode cost of training (OmniSafe judges it on the same recent episodes' mean). It bounds the cost of
the policy being learnt; the cost paid while learning it is what COX-Q also keeps low.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from q2real.agents.algos.sac import SAC, SACConfig
from q2real.agents.common.actor_critic import Sizes, make_optimizer
from q2real.agents.common.cost_critic import CostCritic
from q2real.agents.common.heads import QuantileHead, ScalarHead
from q2real.agents.common.lagrange import EpisodeCost, Lagrange
from q2real.agents.common.networks import set_matmul_dtype
from q2real.agents.common.replay import Batch
from q2real.sim.vec_env import StepResult


@dataclass
class SACLagConfig(SACConfig):
    cost_limit: float = 25.0
    """d: the episode cost allowed (OmniSafe's benchmark: 25)."""
    num_cost_critics: int = 1
    """Critics in the cost critic's ensemble (OmniSafe's SAC-Lag prices the cost with one)."""
    lagrange_init: float = 0.0
    """lambda, the price of cost in the actor's objective, at the start."""
    lagrange_lr: float = 1e-5
    """lambda's step per actor update and unit of episode cost over the limit. J_c lags the policy by
    the episodes it averages; a faster lambda overshoots (on cartpole at 1e-4 it reached its maximum
    within 20k steps and the policy stopped moving)."""
    lagrange_max: float = 100.0
    """lambda's upper bound: how far the actor may trade reward for cost."""
    cost_average_rate: float = 0.1
    """Weight of each finished episode in the running episode cost J_c."""
    limit_horizon: int = 1000
    """T, the episode length the limit is spread over: the per-state limit on Q_c is then
    d_Q = d (1 - gamma^T) / ((1 - gamma) T), the discounted cost to come of a policy paying d evenly."""

    def checks(self) -> list[tuple[bool, str, str]]:
        return [
            *super().checks(),
            (0 <= self.cost_limit < math.inf, "cost_limit", ">= 0 and finite"),
            (self.num_cost_critics >= 1, "num_cost_critics", ">= 1"),
            (0 <= self.lagrange_init <= self.lagrange_max, "lagrange_init", "in [0, lagrange_max]"),
            (0 < self.lagrange_lr < math.inf, "lagrange_lr", "> 0 and finite"),
            (0 < self.lagrange_max < math.inf, "lagrange_max", "> 0 and finite"),
            (0 < self.cost_average_rate <= 1, "cost_average_rate", "in (0, 1]"),
            (self.limit_horizon >= 1, "limit_horizon", ">= 1"),
            (self.chunk.size == 1, "chunk.size", "1: a constrained learner prices single actions"),
        ]


class SACLag(SAC):
    config: SACLagConfig
    cost_estimate = "ensemble mean"
    """How `cost_values` reads the cost critic's ensemble, as the bundle's metadata states it."""

    def __init__(self, config: SACLagConfig, sizes: Sizes):
        super().__init__(config, sizes)
        head, tail_start = self.cost_head()
        self.cost_critic = CostCritic(
            sizes.obs_dim,
            sizes.action_dim,
            config.critic_hidden,
            config.network,
            config.num_cost_critics,
            head,
            tail_start,
        ).to(sizes.device)
        set_matmul_dtype(self.cost_critic, self.matmul_dtype)
        self.cost_optim = make_optimizer(self.cost_critic.critic.parameters(), config.critic_lr, config.weight_decay)
        self.lagrange = Lagrange(config.cost_limit, config.lagrange_init, config.lagrange_lr, config.lagrange_max)
        self.episode_cost = EpisodeCost(sizes.num_envs, config.cost_average_rate)
        self.lagrange.to(sizes.device)
        self.episode_cost.to(sizes.device)
        g, t = config.gamma, config.limit_horizon
        self.value_limit = config.cost_limit * (1 - g**t) / ((1 - g) * t) if g < 1 else config.cost_limit
        """d_Q: the per-state limit on Q_c matching the episode limit (`limit_horizon`)."""

    def cost_head(self) -> tuple[ScalarHead | QuantileHead, int]:
        """The cost critic's head and where its priced quantiles start (`CostCritic`)."""
        return ScalarHead(self.config.huber, upper=True), 0

    def cost_values(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The cost the actor is charged, (B,)."""
        return self.cost_critic.value(obs, action)

    def cost_target_action(self, next_obs: torch.Tensor) -> torch.Tensor:
        """a' of the cost backup: sampled from the policy, as for the reward."""
        return self.actor.sample(next_obs)[0]

    def critic_step(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        metrics, td_abs = super().critic_step(batch)
        obs, next_obs = self.obs_norm(batch.obs), self.obs_norm(batch.next_obs)
        with torch.no_grad():
            next_action = self.cost_target_action(next_obs)
        loss = self.cost_critic.loss(obs, batch.action, next_obs, next_action, batch.cost, batch.discount, batch.weight)
        self._step(self.cost_optim, loss, self.cost_critic.critic)
        self.cost_critic.soft_update(self.config.tau)
        return metrics | {"cost_critic_loss": loss.detach()}, td_abs

    def actor_objective(self, obs: torch.Tensor, action: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
        lam = self.lagrange.value
        return (super().actor_objective(obs, action, log_prob) + lam * self.cost_values(obs, action)) / (1 + lam)

    def actor_update(self, raw_obs: torch.Tensor) -> dict[str, torch.Tensor]:
        metrics = super().actor_update(raw_obs)
        self.lagrange.update(self.episode_cost.average, self.episode_cost.seen)
        return metrics

    def on_step(self, result: StepResult) -> None:
        super().on_step(result)
        self.episode_cost.update(result)

    def metrics(self) -> dict[str, torch.Tensor]:
        return {"lagrange": self.lagrange.value.clone(), "episode_cost_estimate": self.episode_cost.average.clone()}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimizers(), "cost_critic": self.cost_optim}
