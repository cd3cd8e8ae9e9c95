"""Rewards as named terms, weighted by scales in the task's config and summed here, in one place.

As MuJoCo Playground keeps `reward_config.scales` beside each task's dict of reward terms, a task here
returns its terms unscaled (`Task.reward_terms`) and its config holds one scale per term
(`reward_scales`): a term is reweighted, or switched off with 0, from a preset or the command line
(`env.task_params.reward_scales.<term>=...`) without touching task code, and training logs each term's
scaled episode sum (`reward/<term>`), so a reader sees which term pays and which one costs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from q2real.configs.loader import ConfigError


@dataclass
class RewardScales:
    """Per reward term, the scale it is summed with; each task's config lists its own terms."""


class WeighedReward(NamedTuple):
    reward: torch.Tensor
    """Per env, the step's reward (num_envs,)."""
    shares: dict[str, torch.Tensor]
    """Per term, its scaled part of `reward` (num_envs,), in the task's term order."""


def weigh(terms: Mapping[str, torch.Tensor], scales: RewardScales, mean: bool = False) -> WeighedReward:
    """The reward of unscaled `terms` under `scales` (a field per term), and each term's part of it.

    The gains (terms of scale >= 0) are summed in order, then the penalties (scale < 0) summed in order
    are taken off: the order the tasks wrote their rewards in (`tracking + 0.5 yaw - (2 v_z^2 + ...)`),
    so float32 gives the same numbers bit for bit. With `mean`, the result is divided by the sum of the
    scales' magnitudes: a weighted mean, which keeps a reward of terms in [0, 1] in [0, 1] whatever the
    (non-negative) weights. A share is the term times its scale (over that sum with `mean`); shares add up to the
    reward up to float rounding.
    """
    if not terms:
        raise ValueError("weigh: a reward needs at least one term")
    weights = [getattr(scales, name) for name in terms]
    parts = {name: abs(scale) * term for (name, term), scale in zip(terms.items(), weights, strict=True)}
    gains = [part for part, scale in zip(parts.values(), weights, strict=True) if scale >= 0]
    penalties = [part for part, scale in zip(parts.values(), weights, strict=True) if scale < 0]
    reward = functools.reduce(operator.add, gains) if gains else None
    if penalties:
        cost = functools.reduce(operator.add, penalties)
        reward = -cost if reward is None else reward - cost
    assert reward is not None
    shares = {name: part if scale >= 0 else -part for (name, part), scale in zip(parts.items(), weights, strict=True)}
    if mean:
        total = sum(abs(scale) for scale in weights)
        return WeighedReward(reward / total, {name: share / total for name, share in shares.items()})
    return WeighedReward(reward, shares)


def check_scales(scales: RewardScales, terms: Sequence[str], mean: bool) -> None:
    """Refuse a scale that is not a finite number, and a weighted mean (`weigh`'s `mean`) whose `terms`
    all have scale 0."""
    key = "env.task_params.reward_scales"
    for f in dataclasses.fields(scales):
        value = getattr(scales, f.name)
        if not math.isfinite(value):
            raise ConfigError(f"{key}.{f.name}: expected a finite number, got {value}")
    if mean and not any(getattr(scales, name) for name in terms):
        raise ConfigError(f"{key}: the reward is the weighted mean of {list(terms)}: give one a nonzero scale")
