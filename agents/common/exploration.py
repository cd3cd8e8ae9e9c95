"""Exploration rules: how a learner perturbs its actions while collecting data, per env."""

from __future__ import annotations

import torch


class MixedGaussianNoise:
    """Per-env Gaussian action-noise scales in [sigma_min, sigma_max].

    PQL (Li et al. 2023, Sec. 3.3) spreads fixed scales evenly over the envs; FastTD3 draws them
    uniformly and redraws an env's scale when its episode ends (`resample_on_done`). With
    sigma_min == sigma_max this is plain TD3 exploration noise.
    """

    def __init__(self, num_envs: int, sigma_min: float, sigma_max: float, resample_on_done: bool, device):
        self.low, self.high, self.resample = sigma_min, sigma_max, resample_on_done
        if resample_on_done:
            self.sigma = sigma_min + (sigma_max - sigma_min) * torch.rand(num_envs, 1, device=device)
        else:
            self.sigma = torch.linspace(sigma_min, sigma_max, num_envs, device=device).unsqueeze(-1)

    def perturb(self, action: torch.Tensor) -> torch.Tensor:
        return (action + self.sigma * torch.randn_like(action)).clamp(-1.0, 1.0)

    def on_done(self, done: torch.Tensor) -> None:
        if self.resample:
            fresh = self.low + (self.high - self.low) * torch.rand_like(self.sigma)
            self.sigma = torch.where(done[:, None], fresh, self.sigma)

    def state_dict(self) -> dict:
        return {"sigma": self.sigma}

    def load_state_dict(self, state: dict) -> None:
        self.sigma = state["sigma"].to(self.sigma.device)


class NoiseRepetition:
    """FlashSAC's temporally correlated exploration (Kim et al. 2026, Sec. 3.4): each env holds its
    standard-normal policy noise for k steps, k ~ Zeta(mu) truncated to [1, max_repeat]."""

    def __init__(self, num_envs: int, action_dim: int, mu: float, max_repeat: int, device):
        ks = torch.arange(1, max_repeat + 1, dtype=torch.float32, device=device)
        self.probs = ks.pow(-mu) / ks.pow(-mu).sum()
        self.noise = torch.randn(num_envs, action_dim, device=device)
        self.left = torch.zeros(num_envs, dtype=torch.long, device=device)

    def next(self) -> torch.Tensor:
        expired = self.left <= 0
        fresh = torch.randn_like(self.noise)
        self.noise = torch.where(expired[:, None], fresh, self.noise)
        draws = torch.multinomial(self.probs, self.left.numel(), replacement=True) + 1
        self.left = torch.where(expired, draws, self.left) - 1
        return self.noise

    def on_done(self, done: torch.Tensor) -> None:
        self.left = torch.where(done, 0, self.left)

    def state_dict(self) -> dict:
        return {"noise": self.noise, "left": self.left}

    def load_state_dict(self, state: dict) -> None:
        self.noise, self.left = state["noise"].to(self.noise.device), state["left"].to(self.left.device)
