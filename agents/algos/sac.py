"""Soft Actor-Critic (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications").

Twin critics with clipped double-Q, tanh-Gaussian actor, automatic entropy temperature. With
`noise_repeat` the exploration noise is held for Zeta-distributed spans (FlashSAC).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from q2real.agents.common.actor_critic import ActorCritic, ActorCriticConfig, Sizes, make_optimizer, step_optimizer
from q2real.agents.common.exploration import NoiseRepetition
from q2real.agents.common.networks import GaussianActor
from q2real.sim.vec_env import StepResult


@dataclass
class SACConfig(ActorCriticConfig):
    init_alpha: float = 0.1
    """Initial entropy temperature. Lower than SB3's 1.0: with per-step rewards in [0, 1] (dm_control
    style) an initial alpha of 1 lets the entropy bonus swamp the reward for thousands of updates."""
    alpha_lr: float = 3e-4
    """Adam learning rate of the entropy temperature (as log alpha), which steers the policy's entropy
    towards `target_entropy`."""
    target_entropy: float | None = None
    """Entropy target; None means -|A| (SAC paper; |A| counts every action of a chunk), unless
    `target_action_std` is set."""
    target_action_std: float | None = None
    """FlashSAC's target: the entropy of a Gaussian with this std per action dim (eq. in Sec. 3.3)."""
    log_std_min: float = -5.0
    """Lower end of the actor's log standard deviation (before tanh squashing): how narrow the policy
    may get."""
    log_std_max: float = 2.0
    """Upper end of the actor's log standard deviation: how wide its exploration may get."""
    noise_repeat: bool = False
    """Hold exploration noise for k ~ Zeta(noise_repeat_mu) steps (FlashSAC)."""
    noise_repeat_mu: float = 2.0
    """Exponent of the Zeta law of the hold k (P(k) ~ k^-mu): larger holds the noise for fewer steps."""
    noise_repeat_max: int = 16
    """Longest hold of repeated exploration noise, in env steps."""
    actor_uses_mean_q: bool = False
    """Actor maximises the mean of the critics instead of their minimum (FastSAC)."""

    def checks(self) -> list[tuple[bool, str, str]]:
        std = self.target_action_std
        return [
            *super().checks(),
            (0 < self.init_alpha < math.inf, "init_alpha", "> 0 and finite"),
            (0 < self.alpha_lr < math.inf, "alpha_lr", "> 0 and finite"),
            (self.target_entropy is None or math.isfinite(self.target_entropy), "target_entropy", "finite or null"),
            (std is None or 0 < std < math.inf, "target_action_std", "> 0 and finite, or null"),
            (-math.inf < self.log_std_min < self.log_std_max < math.inf, "log_std_min", "finite and < log_std_max"),
            (0 < self.noise_repeat_mu < math.inf, "noise_repeat_mu", "> 0 and finite"),
            (self.noise_repeat_max >= 1, "noise_repeat_max", ">= 1"),
        ]


class SAC(ActorCritic):
    config: SACConfig
    actor: GaussianActor

    def __init__(self, config: SACConfig, sizes: Sizes):
        super().__init__(config, sizes)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(config.init_alpha), device=sizes.device))
        self.alpha_optim = make_optimizer([self.log_alpha], config.alpha_lr, 0.0)
        if config.target_entropy is not None:
            self.target_entropy = config.target_entropy
        elif config.target_action_std is not None:
            self.target_entropy = 0.5 * self.policy_dim * math.log(2 * math.pi * math.e * config.target_action_std**2)
        else:
            self.target_entropy = -float(self.policy_dim)
        self.repeat: NoiseRepetition | None = None
        if config.noise_repeat:
            mu, longest = config.noise_repeat_mu, config.noise_repeat_max
            self.repeat = NoiseRepetition(sizes.num_envs, self.policy_dim, mu, longest, sizes.device)
        self._log_prob: torch.Tensor | None = None
        """The actor step's log pi(a|s), detached, for the temperature's step after it."""

    def build_actor(self) -> nn.Module:
        cfg = self.config
        return GaussianActor(
            self.policy_obs_dim, self.policy_dim, cfg.actor_hidden, cfg.network, (cfg.log_std_min, cfg.log_std_max)
        )

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp().detach()

    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        noise = self.repeat.next() if self.repeat is not None else None
        return self.actor.sample(obs, noise)[0]

    def target_action(self, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        action, log_prob = self.actor.sample(next_obs)
        return action, -self.alpha * log_prob

    def actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """J_pi = E[alpha log pi(a|s) - Q(s, a)] (eq. 7), a reparameterised; then J_alpha (eq. 18)."""
        action, log_prob = self.actor.sample(obs)
        loss = self.actor_objective(obs, action, log_prob).mean()
        self._log_prob = log_prob.detach()
        return loss, {"alpha": self.alpha, "entropy": -log_prob.detach().mean()}

    def actor_objective(self, obs: torch.Tensor, action: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
        """Per sample, alpha log pi(a|s) - Q(s, a) for the reparameterised `action`; constrained learners
        add their cost term."""
        q = self.q_values(obs, action)
        q = q.mean(0) if self.config.actor_uses_mean_q else q.min(0).values
        return self.alpha * log_prob - q

    def after_actor_step(self) -> None:
        assert self._log_prob is not None, "after_actor_step runs after actor_loss"
        self.backward(-(self.log_alpha * (self._log_prob + self.target_entropy)).mean(), [self.log_alpha])
        step_optimizer(self.alpha_optim)

    def on_step(self, result: StepResult) -> None:
        if self.repeat is not None:
            self.repeat.on_done(result.done)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimizers(), "alpha": self.alpha_optim}

    def extra_state(self) -> dict:
        return {"repeat": self.repeat.state_dict()} if self.repeat is not None else {}

    def load_extra_state(self, state: dict) -> None:
        if self.repeat is not None:
            self.repeat.load_state_dict(state["repeat"])
