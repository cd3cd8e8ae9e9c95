"""When a new version on trial is kept or thrown out: the rule, apart from the robot.

The new version and the last good one take turns in segments of equal length, paired in alternating
order: (new, good), (good, new), (new, good), ... Each pair's difference compares the two versions on the
robot as it was within a few seconds, and a slow change of the robot, its load or its commands adds to
one pair's difference what it takes from the next (a counterbalanced design), which a comparison with a
window run before the trial cannot do.

Over the pairs so far, the mean difference in reward per tick and in the share of ticks the shield
changed gets a one-sided Student-t bound each way. The version is aborted as soon as the upper bound of
its reward difference is below minus the tolerated drop (or the lower bound of its intervention rise is
above the tolerated rise), and accepted only once the lower bound of its reward difference is above
minus the drop and the upper bound of its intervention rise below the rise. Each bound holds at
`confidence` for one look, and the rule looks after every pair, so over a whole trial the errors are
larger than one look's: on hand-made reward streams (`tests/deploy_ros/test_trial.py`) with
`confidence` 0.95, a version as good as the last is thrown out in at most 10 % of trials and one 15 %
worse (against 10 % tolerated) kept in at most 5 %. A version that decides neither way within `max_pairs` is not
kept.

The pairs cannot see a version that drags the last good one down with it: on a robot, each segment
starts from the state the other version left, so a version that puts the arm somewhere bad makes the
good version's next turn bad too, and their difference stays near zero while the robot does worse under
both. So the trial also compares the new version's segments with the last good version's level just
before it (`before`: segments of the same length it ran in the ticks before the swap), with a one-sided
Welch bound, and aborts a version worse than that level by the tolerated drop. That comparison reads a
change of the robot itself as the version's fault, so it is made only while the version cannot yet be
kept (its first `min_pairs` pairs, a few seconds after the window it compares with), when a real drift
has had little time to act and a version that hurts the robot has had little time to do so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class Segment:
    """One stretch of ticks under one version."""

    reward: float
    """Mean reward per tick over its running ticks with a reward (NaN: none)."""
    changed: float
    """Share of its running ticks on which the shield changed the action."""
    running: int
    """Ticks on which the policy ran (RUN) under this segment's version."""
    ticks: int
    """Ticks the segment spans."""


@dataclass(frozen=True)
class TrialRule:
    min_pairs: int
    """Pairs before a version may be accepted."""
    max_pairs: int
    """Pairs after which a version not yet accepted is thrown out."""
    confidence: float
    """One-sided confidence of each bound."""
    return_drop: float
    """Tolerated drop in reward per tick, as a fraction of the last good version's."""
    intervention_rise: float
    """Tolerated rise in the share of ticks the shield changed."""


@dataclass(frozen=True)
class Verdict:
    decision: Literal["wait", "abort", "accept"]
    detail: str
    pairs: int = 0
    reward_difference: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    """Mean paired difference in reward per tick (new - good), its lower and upper one-sided bounds."""
    intervention_difference: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    """The same for the share of ticks the shield changed."""


def t_quantile(p: float, dof: int) -> float:
    """Student t's p-quantile: exact for 1 and 2 degrees of freedom, Hill's expansion (Abramowitz and
    Stegun 26.7.5) beyond, within 0.5 % of the tables from 3 degrees of freedom for p up to 0.99."""
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / dof + g2 / dof**2 + g3 / dof**3 + g4 / dof**4


def _bounds(differences: np.ndarray, confidence: float, least_std: float = 0.0) -> tuple[float, float, float]:
    """The mean and its one-sided bounds; the spread taken as at least `least_std` (a share of a few dozen
    ticks comes in steps, and two pairs may differ alike by chance)."""
    mean = float(differences.mean())
    n = len(differences)
    if n < 2:
        return mean, -math.inf, math.inf
    std = max(float(differences.std(ddof=1)), least_std)
    half = t_quantile(confidence, n - 1) * std / math.sqrt(n)
    return mean, mean - half, mean + half


def _welch(a: np.ndarray, b: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its one-sided bounds, for two samples of unequal spread (Welch's t, its
    degrees of freedom rounded down)."""
    mean = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return mean, -math.inf, math.inf
    va, vb = float(a.var(ddof=1)) / len(a), float(b.var(ddof=1)) / len(b)
    spread = va + vb
    dof = spread**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if spread > 0 else len(a) + len(b) - 2
    half = t_quantile(confidence, max(1, math.floor(dof))) * math.sqrt(spread)
    return mean, mean - half, mean + half


def new_runs(segment: int) -> bool:
    """Whether the new version runs segment `segment` of a trial: it starts, and pairs of segments
    alternate their order, (new, good), (good, new), (new, good), ..., so a drift adds to the difference
    in one pair what it takes away in the next, and no two pairs share a segment."""
    pair, second = divmod(segment, 2)
    return bool(second) == bool(pair % 2)


def verdict(rule: TrialRule, pairs: list[tuple[Segment, Segment]], before: Sequence[float] = ()) -> Verdict:
    """The decision on the pairs (the good version's segment, the new one's) finished so far, and the last
    good version's reward per tick over segments of the same length just before the trial (`before`;
    with fewer than two, the pairs alone decide)."""
    for k, (good, new) in enumerate(pairs):
        if new.running < new.ticks / 2:  # it took the robot out of RUN, or nobody let it run
            ran = f"{new.running} of its {new.ticks} ticks"
            return Verdict("abort", f"the policy ran on {ran} in pair {k + 1}; a version is kept on its record")
        if not math.isfinite(new.reward):
            return Verdict("abort", f"its reward per tick in pair {k + 1} is {new.reward}")
        if good.running < good.ticks / 2 or not math.isfinite(good.reward):
            return Verdict(
                "abort",
                f"the last good version ran on {good.running} of its {good.ticks} ticks in pair {k + 1}: "
                "nothing to compare with",
            )
    n = len(pairs)
    if n < 1:
        return Verdict("wait", "no pair finished yet")
    reward = np.array([new.reward - good.reward for good, new in pairs])
    changed = np.array([new.changed - good.changed for good, new in pairs])
    level = np.array(before, dtype=float)
    level = level[np.isfinite(level)]
    reference = float(np.mean([good.reward for good, _ in pairs]))
    drop = rule.return_drop * abs(reference)
    # A share of ticks is binomial: its difference varies by at least its two binomial errors.
    share = float(np.mean([[good.changed, new.changed] for good, new in pairs]))
    ticks = np.mean([1 / good.running + 1 / new.running for good, new in pairs])
    r, c = _bounds(reward, rule.confidence), _bounds(changed, rule.confidence, math.sqrt(share * (1 - share) * ticks))
    detail = (
        f"{n} pairs: reward per tick {r[0]:+.4g} [{r[1]:+.4g}, {r[2]:+.4g}] against the last good version's "
        f"{reference:.4g} (tolerated drop {drop:.4g}); shield changes {c[0]:+.1%} [{c[1]:+.1%}, {c[2]:+.1%}] "
        f"(tolerated rise {rule.intervention_rise:.1%})"
    )
    if r[2] < -drop or c[1] > rule.intervention_rise:
        return Verdict("abort", f"worse at {rule.confidence:.0%}: {detail}", n, r, c)
    own = np.array([new.reward for _, new in pairs])
    if len(level) >= 2 and n <= rule.min_pairs:
        b = _welch(own, level, rule.confidence)
        if b[2] < -drop:
            return Verdict(
                "abort",
                f"worse at {rule.confidence:.0%} than the last good version before the trial: its segments "
                f"{own.mean():.4g} per tick against {level.mean():.4g} over the {len(level)} segments before "
                f"({b[0]:+.4g} [{b[1]:+.4g}, {b[2]:+.4g}], tolerated drop {drop:.4g}); {detail}",
                n, r, c,
            )  # fmt: skip
    if n >= rule.min_pairs and r[1] >= -drop and c[2] <= rule.intervention_rise:
        return Verdict("accept", f"no worse at {rule.confidence:.0%}: {detail}", n, r, c)
    if n >= rule.max_pairs:
        return Verdict("abort", f"undecided after {n} pairs: {detail}", n, r, c)
    return Verdict("wait", detail, n, r, c)
