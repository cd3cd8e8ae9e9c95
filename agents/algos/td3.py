"""TD3 (Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods") and
DDPG (Lillicrap et al. 2016) as TD3 with other defaults, as stable-baselines3 does.

FastTD3's options (Seo et al. 2025) are config switches: per-env mixed exploration noise, a
categorical critic, large batches, and bootstrapping from the online actor.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from q2real.agents.common.actor_critic import ActorCritic, ActorCriticConfig, Sizes
from q2real.agents.common.exploration import MixedGaussianNoise
from q2real.agents.common.networks import DeterministicActor, polyak
from q2real.sim.vec_env import StepResult


@dataclass
class TD3Config(ActorCriticConfig):
    policy_delay: int = 2
    exploration_noise: float = 0.1
    """Std of the Gaussian exploration noise (the upper end when mixed)."""
    exploration_noise_min: float | None = None
    """Set below `exploration_noise` for per-env mixed noise in [min, exploration_noise] (PQL/FastTD3)."""
    resample_noise_on_done: bool = False
    """Redraw an env's noise scale when its episode ends (FastTD3) instead of fixed scales (PQL)."""
    target_noise: float = 0.2
    """Target policy smoothing std (TD3 eq. 15); 0: no smoothing (DDPG)."""
    target_noise_clip: float = 0.5
    """The smoothing noise is clipped to +-this before it is added to the bootstrap action (TD3's c)."""
    target_actor: bool = True
    """Bootstrap from a Polyak-averaged actor; FastTD3 uses the online actor (False)."""

    def checks(self) -> list[tuple[bool, str, str]]:
        low = self.exploration_noise_min
        return [
            *super().checks(),
            (0 <= self.exploration_noise < math.inf, "exploration_noise", ">= 0 and finite"),
            (low is None or 0 <= low <= self.exploration_noise, "exploration_noise_min", "in [0, exploration_noise]"),
            (0 <= self.target_noise < math.inf, "target_noise", ">= 0 and finite"),
            (0 <= self.target_noise_clip < math.inf, "target_noise_clip", ">= 0 and finite"),
        ]


@dataclass
class DDPGConfig(TD3Config):
    num_critics: int = 1
    policy_delay: int = 1
    target_noise: float = 0.0
    target_noise_clip: float = 0.0


class TD3(ActorCritic):
    config: TD3Config

    def __init__(self, config: TD3Config, sizes: Sizes):
        super().__init__(config, sizes)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False) if config.target_actor else None
        low = config.exploration_noise if config.exploration_noise_min is None else config.exploration_noise_min
        self.noise = MixedGaussianNoise(
            sizes.num_envs, low, config.exploration_noise, config.resample_noise_on_done, sizes.device
        )

    def build_actor(self) -> nn.Module:
        return DeterministicActor(self.policy_obs_dim, self.policy_dim, self.config.actor_hidden, self.config.network)

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        return self.noise.perturb(self.actor(obs))

    def target_action(self, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """a' = clip(pi'(s') + clip(eps, -c, c), -1, 1), eps ~ N(0, sigma^2) (TD3 eq. 15)."""
        cfg = self.config
        action = (self.actor_target or self.actor)(next_obs)
        if cfg.target_noise > 0:
            noise = (cfg.target_noise * torch.randn_like(action)).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
            action = (action + noise).clamp(-1.0, 1.0)
        return action, torch.zeros(next_obs.shape[0], device=next_obs.device)

    def actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Deterministic policy gradient: maximise min_i Q_i(s, pi(s))."""
        return -self.q_values(obs, self.actor(obs)).min(0).values.mean(), {}

    def after_actor_step(self) -> None:
        if self.actor_target is not None:
            polyak(self.actor_target, self.actor, self.config.tau)

    def on_step(self, result: StepResult) -> None:
        self.noise.on_done(result.done)

    def extra_state(self) -> dict:
        return {"noise": self.noise.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        self.noise.load_state_dict(state["noise"])
