"""Stream AC(lambda) (Elsayed, Vasan & Mahmood 2024): an actor-critic that learns from each transition
once, as it happens, with no replay, no batch and no target network.

Per transition: delta = r / sigma_G + gamma (1 - terminal) V(s') - V(s) with observations normalized
online (Welford) and rewards scaled by the running std of the discounted return (no centring); the
critic's trace follows grad V(s), the actor's grad [log pi(a|s) + c sign(delta) H(pi(.|s))], and both
take ObGD steps along delta (kappa 2 and 3). Traces reset where an episode ends.

One departure from stream-x's code: the log-probability is of the action that was executed, clipped
to [-1, 1] (on a robot, the shielded command), not of the raw sample; a mean drifting past the range
is then pulled back rather than followed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from q2real.agents.common.normalizer import ObsNormalizer, ReturnScaler
from q2real.agents.stream.networks import StreamPolicy, sparse_mlp
from q2real.agents.stream.obgd import ObGD


@dataclass
class StreamACConfig:
    gamma: float = 0.99
    """Discount per env step."""
    lamda: float = 0.8
    """Trace decay lambda (stream-x's default)."""
    lr: float = 1.0
    """ObGD's step size before its overshooting bound, which shrinks any step that would carry the
    prediction past its own target (stream-x's 1.0)."""
    kappa_value: float = 2.0
    """The critic's ObGD bound factor (>= 1): larger keeps each step further from overshooting."""
    kappa_policy: float = 3.0
    """The actor's ObGD bound factor (>= 1)."""
    entropy_coef: float = 0.01
    """Weight of the policy's entropy in the actor's objective (signed by the TD error)."""
    hidden: tuple[int, ...] = (128, 128)
    """Hidden layer widths of the actor and the critic."""
    sparsity: float = 0.9
    """Share of each unit's input weights set to zero at initialization (sparse init, as stream-x)."""

    def checks(self) -> list[tuple[bool, str, str]]:
        return [
            (0 < self.gamma <= 1, "gamma", "in (0, 1]"),
            (0 <= self.lamda <= 1, "lamda", "in [0, 1]"),
            (0 < self.lr < math.inf, "lr", "> 0 and finite"),
            (1 <= self.kappa_value < math.inf, "kappa_value", ">= 1 and finite"),
            (1 <= self.kappa_policy < math.inf, "kappa_policy", ">= 1 and finite"),
            (0 <= self.entropy_coef < math.inf, "entropy_coef", ">= 0 and finite"),
            (len(self.hidden) >= 1 and all(w >= 1 for w in self.hidden), "hidden", "one or more widths >= 1"),
            (0 <= self.sparsity < 1, "sparsity", "in [0, 1)"),
        ]


class StreamAC(nn.Module):
    def __init__(self, config: StreamACConfig, obs_dim: int, action_dim: int, device: torch.device):
        super().__init__()
        self.config, self.obs_dim, self.action_dim = config, obs_dim, action_dim
        self.obs_norm = ObsNormalizer(obs_dim)
        self.return_scale = ReturnScaler(1, config.gamma, math.inf)
        self.actor = StreamPolicy(obs_dim, action_dim, config.hidden, config.sparsity)
        self.value = sparse_mlp(obs_dim, config.hidden, 1, config.sparsity)
        self.to(device)
        self.device = device
        self.value_optim = ObGD(self.value.parameters(), config.lr, config.gamma, config.lamda, config.kappa_value)
        self.actor_optim = ObGD(self.actor.parameters(), config.lr, config.gamma, config.lamda, config.kappa_policy)
        self._td = torch.zeros((), device=device)
        self.updates = 0
        """Transitions learned from (the loop's updates/s)."""

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions in [-1, 1] for raw observations (B, obs_dim)."""
        normalized = self.obs_norm(obs)
        if deterministic:
            return self.actor(normalized)
        return self.actor.distribution(normalized).sample().clamp(-1.0, 1.0)

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
        done: torch.Tensor,
    ) -> None:
        """One streaming update from one transition (every tensor with a batch of 1)."""
        cfg = self.config
        self.obs_norm.update(next_obs)
        self.return_scale.update(reward, done)
        s, s_next = self.obs_norm(obs), self.obs_norm(next_obs)
        r = reward[0] / self.return_scale.scale()
        end = done[0]
        v = self.value(s)[0, 0]
        with torch.no_grad():
            bootstrap = self.value(s_next)[0, 0] * (~terminated[0])
            delta = r + cfg.gamma * bootstrap - v.detach()
        self.value_optim.zero_grad()
        v.backward()
        self.value_optim.step(delta, end)
        dist = self.actor.distribution(s)
        objective = dist.log_prob(action).sum() + cfg.entropy_coef * torch.sign(delta) * dist.entropy().sum()
        self.actor_optim.zero_grad()
        objective.backward()
        self.actor_optim.step(delta, end)
        self._td = delta
        self.updates += 1

    def metrics(self) -> dict[str, torch.Tensor]:
        return {
            "td_error": self._td.abs(),
            "value_step": self.value_optim.last_step,
            "policy_step": self.actor_optim.last_step,
        }

    def optimizer_state(self) -> dict:
        return {"value": self.value_optim.state_dict(), "actor": self.actor_optim.state_dict()}

    def load_optimizer_state(self, state: dict) -> None:
        self.value_optim.load_state_dict(state["value"])
        self.actor_optim.load_state_dict(state["actor"])
