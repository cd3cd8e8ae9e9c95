"""stream-x's networks: sparse initialization and LayerNorm without affine parameters.

At batch size 1 every step moves every weight; sparse initialization (90 % of each unit's inputs
zeroed) keeps units from moving together, and LayerNorm keeps activations in range as the inputs
drift (Elsayed et al. 2024, Sec. 4). Leaky ReLU as in their code.
"""

from __future__ import annotations

import math

import torch
from torch import nn


@torch.no_grad()
def sparse_init(layer: nn.Linear, sparsity: float, gen: torch.Generator | None = None) -> None:
    """LeCun-uniform weights, then `sparsity` of each output unit's inputs set to zero; zero bias."""
    fan_in = layer.in_features
    bound = 1.0 / math.sqrt(fan_in)
    layer.weight.uniform_(-bound, bound, generator=gen)
    zeros = math.ceil(sparsity * fan_in)
    for row in layer.weight:
        row[torch.randperm(fan_in, generator=gen)[:zeros]] = 0.0
    layer.bias.zero_()


def sparse_mlp(in_features: int, hidden: tuple[int, ...], out_features: int, sparsity: float) -> nn.Sequential:
    """Linear -> LayerNorm (no affine) -> leaky ReLU per hidden layer, then a linear output."""
    layers: list[nn.Module] = []
    width = in_features
    for size in hidden:
        layers += [nn.Linear(width, size), nn.LayerNorm(size, elementwise_affine=False), nn.LeakyReLU()]
        width = size
    layers.append(nn.Linear(width, out_features))
    for layer in layers:
        if isinstance(layer, nn.Linear):
            sparse_init(layer, sparsity)
    return nn.Sequential(*layers)


class StreamPolicy(nn.Module):
    """Gaussian policy with a softplus std (stream-x's continuous actor). Sampled actions are not
    squashed; the env receives them clipped to [-1, 1] and the log-probability is of the sample."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], sparsity: float):
        super().__init__()
        self.body = sparse_mlp(obs_dim, hidden[:-1], hidden[-1], sparsity)
        self.norm = nn.Sequential(nn.LayerNorm(hidden[-1], elementwise_affine=False), nn.LeakyReLU())
        self.mean = nn.Linear(hidden[-1], action_dim)
        self.std = nn.Linear(hidden[-1], action_dim)
        sparse_init(self.mean, sparsity)
        sparse_init(self.std, sparsity)

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Normal:
        features = self.norm(self.body(obs))
        std = nn.functional.softplus(self.std(features)) + 1e-6
        # Argument validation reads the parameters back to the host on every call: off.
        return torch.distributions.Normal(self.mean(features), std, validate_args=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action: the mean, clipped to the env's range (what evaluation and export run)."""
        return self.mean(self.norm(self.body(obs))).clamp(-1.0, 1.0)
