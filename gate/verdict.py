"""How the gate judges a row: the ratio of its returns to the same episodes' returns as trained, with a
paired bootstrap interval, and a pass when the interval's lower end clears the threshold."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from q2real.configs.errors import Q2RealError

THRESHOLD = 0.9
"""A row passes when the lower end of its ratio's interval is at least this."""


class GateError(Q2RealError):
    """The gate cannot judge this run: an adapter task, no logged evaluation, an unknown row, a failed ROS row."""


@dataclass
class Row:
    name: str
    in_range: bool
    mean: float
    std: float
    ratio: float
    low: float | None = None
    """2.5th percentile of the ratio over episode resamples paired with the reference's (None: one episode)."""
    high: float | None = None
    magnitude: str = "-"
    required: bool = True
    """Counted in the verdict (the stress row is not)."""
    passed: bool = True
    """The interval's lower end (the ratio itself for one episode) clears the threshold."""
    cost: float | None = None
    """Mean episode safety cost, for a task with one (reported beside the return, not judged)."""


BOOTSTRAP = 2000


def ratio_interval(returns: torch.Tensor, reference: torch.Tensor, seed: int = 0) -> tuple[float | None, float | None]:
    """95 % paired bootstrap interval of mean(returns) / mean(reference): episode i of a row ran from the
    same reset state as episode i of the reference, so both are resampled with the same indices."""
    n = len(returns)
    if n < 2:
        return None, None
    gen = torch.Generator().manual_seed(seed)
    index = torch.randint(0, n, (BOOTSTRAP, n), generator=gen)
    ratios = returns.double()[index].mean(1) / reference.double()[index].mean(1)
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return low, high


def wilson_interval(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a rate of `hits` in `n` episodes: unlike the normal approximation it
    stays inside [0, 1] and does not collapse to a point at 0 or n hits (no falls in 32 is not 0 %)."""
    if n < 1:
        raise ValueError(f"a rate needs at least one episode, got {n}")
    rate, spread = hits / n, z * z / n
    centre = (rate + spread / 2) / (1 + spread)
    half = z * math.sqrt(rate * (1 - rate) / n + spread / (4 * n)) / (1 + spread)
    return max(0.0, centre - half), min(1.0, centre + half)


def judged(
    name: str,
    returns: torch.Tensor,
    reference: torch.Tensor,
    threshold: float,
    in_range: bool = True,
    magnitude: str = "-",
    required: bool = True,
) -> Row:
    """A row of `returns` against the `reference` returns of the same episodes. Where the reference's
    mean return is not positive a ratio says nothing (a policy that falls without the shield scores
    below zero): the row passes when its mean return is at least the reference's."""
    mean, ratio = float(returns.mean()), float(returns.mean() / reference.mean())
    low, high = ratio_interval(returns, reference)
    std = float(returns.std()) if len(returns) > 1 else 0.0
    if float(reference.mean()) <= 0:
        passed = mean >= float(reference.mean())
    else:
        passed = (ratio if low is None else low) >= threshold
    return Row(name, in_range, mean, std, ratio, low, high, magnitude, required, passed)


def interval_text(row: Row) -> str:
    return "" if row.low is None or row.high is None else f"[{row.low:.3f}, {row.high:.3f}]"
