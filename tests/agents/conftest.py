"""Fixtures the learner tests share."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from q2real.agents.common.replay import Batch


def make_batch(size: int, obs_dim: int, action_dim: int, seed: int = 0, cost_rate: float = 0.0) -> Batch:
    """A replay batch of Gaussian observations and rewards, uniform actions in [-1, 1], discount 0.99
    and a cost of 1 on a `cost_rate` share of transitions, the same for the same arguments."""
    gen = torch.Generator().manual_seed(seed)
    batch = Batch(
        obs=torch.randn(size, obs_dim, generator=gen),
        action=torch.rand(size, action_dim, generator=gen) * 2 - 1,
        reward=torch.randn(size, generator=gen),
        next_obs=torch.randn(size, obs_dim, generator=gen),
        discount=torch.full((size,), 0.99),
        row=torch.arange(size),
        env=torch.zeros(size, dtype=torch.long),
        cost=torch.zeros(size),
    )
    if cost_rate > 0:
        batch.cost = (torch.rand(size, generator=gen) < cost_rate).float()
    return batch


@pytest.fixture
def random_batch() -> Callable[..., Batch]:
    """`make_batch`, for the tests (the distributed script beside them imports it directly)."""
    return make_batch
