"""Overshooting-bounded gradient descent (ObGD; Elsayed, Vasan & Mahmood 2024, "Streaming Deep RL
Finally Works", Alg. 3) with eligibility traces.

A streaming learner sees each sample once, at batch size 1, so one large TD error can carry a step far
past the target and the next error the other way: the "stream barrier" where batch-1 SAC and PPO
collapse. ObGD bounds the step instead of the gradient: with trace z <- gamma lambda z + grad and
delta_bar = max(|delta|, 1), the step size is lr / max(lr kappa delta_bar ||z||_1, 1), so
step * kappa * delta_bar * ||z||_1 <= 1. For a linear prediction whose features are at most 1 in
magnitude that keeps the update from overshooting its own target (kappa >= 1), which the property
tests check.

Everything stays a tensor (no `.item()`): `delta` is a scalar, or one error per member of a fused
ensemble (applied along every parameter's leading dimension), and `reset` an episode-end flag.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class ObGD:
    """SGD with eligibility traces and the overshooting bound; `grad` accumulates in `.grad` as usual.

    Gradients are of the quantity to *raise* by delta (V(s), log pi(a|s)): the step is
    theta <- theta + step * delta * z.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, gamma: float, lamda: float, kappa: float):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.decay, self.kappa = lr, gamma * lamda, kappa
        self.traces = [torch.zeros_like(p) for p in self.params]
        self.last_step = torch.zeros((), device=self.params[0].device)
        """The step size the bound left of `lr` in the latest update (a tensor, read with the metrics)."""

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, delta: torch.Tensor, reset: torch.Tensor | None = None) -> None:
        """Fold this sample's gradient into the traces, take the bounded step along delta * z, and clear
        the traces where `reset` (episode end; a 0-dim bool tensor) is set."""
        delta = delta.detach()
        norm = torch.zeros((), device=delta.device)
        for p, z in zip(self.params, self.traces, strict=True):
            z.mul_(self.decay)
            if p.grad is not None:
                z.add_(p.grad)
            norm = norm + z.abs().sum()
        delta_bar = delta.abs().max().clamp(min=1.0)
        bound = self.lr * self.kappa * delta_bar * norm
        step = self.lr / bound.clamp(min=1.0)
        self.last_step = step
        for p, z in zip(self.params, self.traces, strict=True):
            scale = delta.reshape(-1, *([1] * (p.dim() - 1))) if delta.dim() else delta
            p.add_(step * scale * z)
            if reset is not None:
                z.mul_(~reset)

    def state_dict(self) -> dict:
        return {"traces": [z.clone() for z in self.traces]}

    def load_state_dict(self, state: dict) -> None:
        for z, saved in zip(self.traces, state["traces"], strict=True):
            z.copy_(saved)
