"""Running statistics that travel with the policy: observation normalization and return scaling."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn


def local(x: torch.Tensor) -> torch.Tensor:
    """The rows of this process are all the rows: a running statistic's `gather` outside data-parallel
    training (there, every rank's rows in rank order, so all ranks compute the same statistic)."""
    return x


Gather = Callable[[torch.Tensor], torch.Tensor]


class ObsNormalizer(nn.Module):
    """Running mean/variance of observations (Chan et al. parallel update), applied as (x - mean) / std.

    Its buffers live in the agent's state dict, so a checkpoint or an exported bundle carries them.
    The last `passthrough` features are left as they are (a base policy's actions in [-1, 1], which a
    residual adds to and so must see unscaled).
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor
    gather: Gather = staticmethod(local)

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-4, enabled: bool = True, passthrough: int = 0):
        super().__init__()
        self.passthrough = passthrough
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(eps))
        self.clip, self.enabled = clip, enabled

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        if not self.enabled:
            return
        x = self.gather(x)
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.var.copy_((self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total) / total)
        self.count.copy_(total)

    def leading(self, dim: int) -> ObsNormalizer:
        """A copy that normalizes the first `dim` features only (the policy's, without critic-only terms)."""
        if dim == self.mean.numel():
            return copy.deepcopy(self)
        if self.passthrough:
            raise ValueError("a normalizer with passthrough features keeps its full width")
        head = ObsNormalizer(dim, self.clip, enabled=self.enabled).to(self.mean.device)
        head.mean.copy_(self.mean[:dim])
        head.var.copy_(self.var[:dim])
        head.count.copy_(self.count)
        return head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        normalized = ((x - self.mean) * torch.rsqrt(self.var + 1e-8)).clamp(-self.clip, self.clip)
        if self.passthrough:
            return torch.cat([normalized[..., : -self.passthrough], x[..., -self.passthrough :]], dim=-1)
        return normalized


class ReturnScaler(nn.Module):
    """FlashSAC's reward scale (Sec. 3.3): r / max(sqrt(Var[G] + eps), G_r_max / G_max), where G is a
    running discounted return per env and G_r_max the largest |G| seen, so categorical critics with a
    fixed support [-G_max, G_max] fit any task's reward magnitude."""

    ret: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor
    abs_max: torch.Tensor
    gather: Gather = staticmethod(local)

    def __init__(self, num_envs: int, gamma: float, g_max: float, enabled: bool = True):
        super().__init__()
        self.register_buffer("ret", torch.zeros(num_envs))
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("var", torch.ones(()))
        self.register_buffer("count", torch.tensor(1e-4))
        self.register_buffer("abs_max", torch.zeros(()))
        self.gamma, self.g_max, self.enabled = gamma, g_max, enabled

    @torch.no_grad()
    def update(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        if not self.enabled:
            return
        self.ret.mul_(self.gamma).add_(reward)
        returns = self.gather(self.ret)
        n = returns.numel()
        batch_mean, batch_var = returns.mean(), returns.var(unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.var.copy_((self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total) / total)
        self.count.copy_(total)
        self.abs_max.copy_(torch.maximum(self.abs_max, returns.abs().max()))
        self.ret.mul_(~done)

    def scale(self) -> torch.Tensor:
        if not self.enabled:
            return torch.ones((), device=self.ret.device)
        return torch.maximum(torch.sqrt(self.var + 1e-8), self.abs_max / self.g_max).clamp_min(1e-8)
