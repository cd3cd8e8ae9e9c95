"""Residual SAC: a bounded correction on a frozen base policy, learned off-policy.

The executed action is a = clip(a_base + scale * u, -1, 1) with u = tanh(mu + sigma eps) from a SAC
actor over [obs, a_base] whose last layer starts at zero (ResFiT), so the deterministic policy is
exactly the base policy until the residual learns; |a - a_base| <= scale per action dimension always.
The critics see the executed (summed) action, which is what replay stores (Policy Decorator's
critic on the sum). With `progressive_steps` = H, each env's exploring action keeps the residual
with probability min(t / H, 1) at env step t and is the base action otherwise (Policy Decorator's
progressive exploration). The entropy bonus is that of u. Critic-only updates come first
(`critic_warmup`), so the actor never follows an untrained critic away from the base.

Without a base (`base_dim` 0) this is SAC with the same sampler and warm-up: RLPD from scratch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from q2real.agents.algos.sac import SAC, SACConfig
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.networks import GaussianActor
from q2real.agents.common.normalizer import ObsNormalizer
from q2real.sim.vec_env import StepResult


@dataclass
class ResidualConfig:
    base: str = ""
    """A BC run directory (`q2real train algo=bc`); empty: no base (RLPD from scratch)."""
    demos: str = ""
    """A LeRobotDataset folder sampled beside online data; empty: online data only."""
    successful_only: bool = True
    """Sample only the demonstrations' successful episodes."""
    demo_fraction: float = 0.5
    """Share of every batch drawn from the demonstrations (RLPD's symmetric sampling: 0.5)."""
    scale: float = 0.1
    """alpha, the residual's bound in action units: |a - a_base| <= scale (ResFiT 0.1; Policy
    Decorator 0.03-0.3)."""
    progressive_steps: int = 0
    """H: the residual acts with probability min(t / H, 1) while exploring; 0 = always."""
    critic_warmup: int = 0
    """Critic-only updates before the actor's first update."""

    def validate(self) -> None:
        checks = [
            (0 <= self.demo_fraction < 1, "demo_fraction", "in [0, 1)"),
            (0 < self.scale <= 1 and math.isfinite(self.scale), "scale", "in (0, 1]"),
            (self.progressive_steps >= 0, "progressive_steps", ">= 0"),
            (self.critic_warmup >= 0, "critic_warmup", ">= 0"),
        ]
        for ok, key, expected in checks:
            if not ok:
                raise ValueError(f"residual.{key}: expected {expected}, got {getattr(self, key)!r}")


class ResidualActor(nn.Module):
    """clip(a_base + scale * u): `a_base` is the last `base_dim` numbers of the (normalized) observation,
    which the observation normalizer passes through unscaled."""

    def __init__(self, actor: GaussianActor, base_dim: int, scale: float):
        super().__init__()
        self.residual, self.base_dim, self.scale = actor, base_dim, scale
        with torch.no_grad():
            actor.head.weight.zero_()
            if actor.head.bias is not None:
                actor.head.bias.zero_()

    def sample(self, obs: torch.Tensor, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        u, log_prob = self.residual.sample(obs, noise)
        return (obs[..., -self.base_dim :] + self.scale * u).clamp(-1.0, 1.0), log_prob

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs[..., -self.base_dim :] + self.scale * self.residual(obs)).clamp(-1.0, 1.0)


class ResidualSAC(SAC):
    collected: torch.Tensor

    def __init__(self, config: SACConfig, sizes: Sizes, residual: ResidualConfig, base_dim: int):
        self.residual, self.base_dim = residual, base_dim
        # The actor reads every observation column: the base action it corrects is the last of them.
        super().__init__(config, dataclasses.replace(sizes, policy_obs_dim=None))
        if base_dim:
            norm = ObsNormalizer(sizes.obs_dim, enabled=config.normalize_obs, passthrough=base_dim)
            self.obs_norm = norm.to(sizes.device)
        self.register_buffer("collected", torch.zeros((), device=sizes.device))
        """Env steps collected so far, on the device (the progressive schedule reads it without a sync)."""

    def build_actor(self) -> nn.Module:
        actor = super().build_actor()
        if not self.base_dim:
            return actor
        assert isinstance(actor, GaussianActor)
        return ResidualActor(actor, self.base_dim, self.residual.scale)

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        action = super().explore(obs)
        steps = self.residual.progressive_steps
        if not self.base_dim or not steps:
            return action
        on = torch.rand(len(obs), 1, device=obs.device) < (self.collected / steps).clamp(max=1.0)
        return torch.where(on, action, obs[:, -self.base_dim :].clamp(-1.0, 1.0))

    def on_step(self, result: StepResult) -> None:
        super().on_step(result)
        self.collected += result.reward.shape[0]

    def actor_due(self) -> bool:
        return self.updates > self.residual.critic_warmup and super().actor_due()
