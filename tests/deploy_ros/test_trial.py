"""The rule that keeps or throws out a version on trial, against hand-made reward streams."""

from __future__ import annotations

import math

import numpy as np
import pytest

from q2real.deploy_ros.learning.trial import Segment, TrialRule, new_runs, t_quantile, verdict

RULE = TrialRule(min_pairs=6, max_pairs=40, confidence=0.95, return_drop=0.1, intervention_rise=0.05)
SEGMENT = 25
BEFORE = RULE.min_pairs
"""Segments the last good version runs before a trial (the node waits for as many before it starts one)."""


@pytest.mark.parametrize(
    ("p", "dof", "table"),
    [(0.95, 1, 6.314), (0.95, 2, 2.920), (0.95, 3, 2.353), (0.95, 5, 2.015), (0.95, 10, 1.812), (0.99, 4, 3.747)],
)
def test_t_quantiles_match_the_tables(p: float, dof: int, table: float) -> None:
    assert t_quantile(p, dof) == pytest.approx(table, rel=5e-3)


def _trial(
    rng: np.random.Generator,
    new_mean: float,
    drift: float = 0.0,
    new_changed: float = 0.0,
    sd: float = 0.05,
    dragged: float = 1.0,
):
    """Run one trial tick by tick, as the robot would: the last good version runs BEFORE segments, then
    the versions take turns for SEGMENT ticks, every tick's reward 1.0 (the good version's; `dragged`
    during the trial, when the new version leaves the robot where the good one does worse too) plus AR(1)
    noise (a robot's reward is correlated from tick to tick: 0.9 from one to the next) plus `drift` per
    tick from the trial's start (a robot slowly changing under both). Returns the verdict and the ticks
    the new version ran."""
    noise, tick = 0.0, -BEFORE * SEGMENT

    def segment(mean: float) -> np.ndarray:
        nonlocal noise, tick
        rewards = np.empty(SEGMENT)
        for i in range(SEGMENT):
            noise = 0.9 * noise + rng.normal(0.0, sd)
            rewards[i] = mean + noise + drift * tick
            tick += 1
        return rewards

    before = [float(segment(1.0).mean()) for _ in range(BEFORE)]
    pairs: list[tuple[Segment, Segment]] = []
    ran: dict[bool, Segment] = {}
    new_ticks = 0
    for k in range(2 * RULE.max_pairs):
        is_new = new_runs(k)
        rewards = segment(new_mean if is_new else dragged)
        new_ticks += SEGMENT * is_new
        changed = rng.random(SEGMENT) < (new_changed if is_new else 0.0) + 0.1
        ran[is_new] = Segment(float(rewards.mean()), float(changed.mean()), SEGMENT, SEGMENT)
        if k % 2:
            pairs.append((ran[False], ran[True]))
            decided = verdict(RULE, pairs, before)
            if decided.decision != "wait":
                return decided, new_ticks
    raise AssertionError("a trial ended without a verdict")


def _outcomes(new_mean: float, trials: int = 300, **kwargs) -> tuple[float, list[int]]:
    rng = np.random.default_rng(7)
    results = [_trial(rng, new_mean, **kwargs) for _ in range(trials)]
    aborted = [ticks for decided, ticks in results if decided.decision == "abort"]
    return len(aborted) / trials, aborted


def test_a_version_worse_than_tolerated_is_thrown_out_within_250_of_its_ticks() -> None:
    rate, ticks = _outcomes(0.7)  # 30 % worse per tick
    assert rate == 1.0 and max(ticks) <= 250, (rate, max(ticks))
    rate, ticks = _outcomes(0.7, sd=0.1)  # a robot twice as noisy: a segment's mean varies by 14 %
    assert rate == 1.0 and np.percentile(ticks, 90) <= 250, (rate, np.percentile(ticks, 90))


@pytest.mark.parametrize("sd", [0.05, 0.1])
def test_a_version_as_good_as_the_last_is_kept_and_seldom_thrown_out(sd: float) -> None:
    rate, _ = _outcomes(1.0, sd=sd)
    assert rate <= 0.1  # each look's bound is one-sided 95 %; looking after every pair adds a little


def test_a_better_version_is_kept_within_a_dozen_pairs() -> None:
    rng = np.random.default_rng(3)
    kept = [_trial(rng, 1.2) for _ in range(100)]
    assert sum(d.decision == "accept" for d, _ in kept) >= 95  # the rest: shield shares too close to call
    # The shield's share of 25 ticks is coarse: telling it within 5 points takes about a dozen pairs.
    assert np.median([d.pairs for d, _ in kept]) <= 12


@pytest.mark.parametrize("drift", [-1e-4, -3e-4])
def test_a_robot_that_changes_during_the_trial_does_not_decide_it(drift: float) -> None:
    """The robot loses up to 0.6 of its reward per tick of 1 over a trial's 2000 ticks, under both versions.
    Pairs alternate their order, so the drift cancels: a comparison with the window before the trial
    would read it as the new version's fault."""
    rate, _ = _outcomes(1.0, drift=drift)
    assert rate <= 0.1
    worse, ticks = _outcomes(0.7, drift=drift)
    assert worse == 1.0 and np.percentile(ticks, 90) <= 250


@pytest.mark.parametrize(("sd", "caught"), [(0.05, 1.0), (0.1, 0.75)])
def test_a_version_that_drags_the_last_good_one_down_with_it_is_thrown_out_within_250_of_its_ticks(
    sd: float, caught: float
) -> None:
    """The good version's turns do as badly as the new one's (each starts where the other left the robot):
    the pairs' differences are zero, and only the level before the trial shows the harm. On the noisier
    robot (a segment's mean varying by 20 %) six segments before and six of its own do not always tell a
    30 % drop: the rest are kept by the pairs."""
    rate, ticks = _outcomes(0.7, dragged=0.7, sd=sd)
    assert rate >= caught and np.percentile(ticks, 90) <= 250, (rate, np.percentile(ticks, 90))
    rate, _ = _outcomes(1.0, dragged=0.95, sd=sd)  # the good version a little worse on trial: seldom thrown out
    assert rate <= 0.1, rate


def test_without_a_level_before_the_trial_the_pairs_alone_decide() -> None:
    bad = Segment(0.7, 0.0, SEGMENT, SEGMENT)
    pairs = [(bad, bad)] * 3
    assert verdict(RULE, pairs).decision == "wait"
    assert verdict(RULE, pairs, [1.0]).decision == "wait"  # one segment before gives no spread
    dropped = verdict(RULE, pairs, [1.0, 1.01, 0.99, 1.0])
    assert dropped.decision == "abort" and "than the last good version before the trial" in dropped.detail
    # Past min_pairs a drift of the robot could explain the drop: the pairs alone decide.
    late = [(bad, bad)] * (RULE.min_pairs + 1)
    assert verdict(RULE, late, [1.0, 1.01, 0.99, 1.0]).decision == verdict(RULE, late).decision == "accept"


def test_pairs_alternate_their_order_and_share_no_segment() -> None:
    assert [new_runs(k) for k in range(8)] == [True, False, False, True, True, False, False, True]


def test_a_version_the_shield_must_correct_more_often_is_thrown_out() -> None:
    rate, ticks = _outcomes(1.0, new_changed=0.3)
    assert rate == 1.0 and max(ticks) <= 250


FULL = Segment(1.0, 0.0, SEGMENT, SEGMENT)


def test_a_version_that_did_not_run_or_whose_reward_is_not_finite_is_thrown_out_at_once() -> None:
    stopped = verdict(RULE, [(FULL, Segment(1.0, 0.0, 10, SEGMENT))])
    assert stopped.decision == "abort" and "ran on 10 of its 25 ticks in pair 1" in stopped.detail
    nan = verdict(RULE, [(FULL, Segment(math.nan, 0.0, SEGMENT, SEGMENT))])
    assert nan.decision == "abort" and "nan" in nan.detail
    unjudged = verdict(RULE, [(FULL, FULL), (Segment(1.0, 0.0, 5, SEGMENT), FULL)])
    assert unjudged.decision == "abort" and "nothing to compare with" in unjudged.detail


def test_one_pair_decides_nothing_and_the_verdict_says_where_it_stands() -> None:
    bad = Segment(0.2, 0.0, SEGMENT, SEGMENT)
    assert verdict(RULE, []).decision == "wait"
    one = verdict(RULE, [(FULL, bad)])
    assert one.decision == "wait" and one.pairs == 1 and one.reward_difference[0] == pytest.approx(-0.8)
    two = verdict(RULE, [(FULL, bad), (FULL, bad)])
    assert two.decision == "abort" and two.detail.startswith("worse at 95%: 2 pairs: reward per tick -0.8")


@pytest.mark.parametrize("sd", [0.05, 0.1])
def test_a_version_just_past_the_tolerated_drop_is_seldom_kept(sd: float) -> None:
    """15 % worse against a tolerated 10 %: looked at after every pair, it is still kept in few trials."""
    rate, _ = _outcomes(0.85, sd=sd)
    assert rate >= 0.95
