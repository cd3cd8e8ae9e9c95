"""Q_c(s, a), the discounted cost still to come: the critic a constrained learner prices actions with.

It is an ensemble like the reward critic, trained on the replay's costs with its own target network
and optimizer, so a reward critic's settings (C51 support, reward scaling) never leak into it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from q2real.agents.common.heads import QuantileHead, ScalarHead
from q2real.agents.common.networks import Critic, Trunk, polyak


class CostCritic(nn.Module):
    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: tuple[int, ...],
        kind: Trunk,
        ensemble: int,
        head: ScalarHead | QuantileHead,
        tail_start: int = 0,
    ):
        """`tail_start`: with a quantile head, the cost is priced by each member's quantiles from this
        index up, the optimistic low-cost ones left out (COX-Q)."""
        super().__init__()
        self.critic = Critic(obs_dim, action_dim, hidden, kind, ensemble, head.out_features)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.head = head
        self.tail_start = tail_start

    def q(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q_c of every member, (E, B), on normalized observations."""
        return self.head.q(self.critic(obs, action))

    def value(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The cost an action is charged, (B,): the members' mean of their (upper-tail) estimates."""
        out = self.critic(obs, action)
        head = self.head
        return (head.upper_tail(out, self.tail_start) if isinstance(head, QuantileHead) else head.q(out)).mean(0)

    def loss(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        next_obs: torch.Tensor,
        next_action: torch.Tensor,
        cost: torch.Tensor,
        discount: torch.Tensor,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """TD loss against c + discount Q'_c(s', a'), samples weighted as the reward critic's are (a
        prioritized sampler's importance weights); no entropy bonus: entropy is a reward, not a cost."""
        with torch.no_grad():
            target_out = self.target(next_obs, next_action)
        zero = torch.zeros_like(cost)
        return self.head.loss(self.critic(obs, action), target_out, cost, discount, zero, weight)[0]

    def soft_update(self, tau: float) -> None:
        polyak(self.target, self.critic, tau)
