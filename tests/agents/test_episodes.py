"""Episode bookkeeping survives a checkpoint: success rates and reward terms included, not only returns
and lengths; a training run logs each reward term."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from q2real.agents.common.episodes import EpisodeTracker
from q2real.agents.config import TrainConfig
from q2real.agents.train import train
from q2real.configs.loader import load
from q2real.sim.vec_env import StepResult


def step(reward: list[float], done: list[bool], success: list[bool], terms: list | None = None) -> StepResult:
    zeros = torch.zeros(len(reward))
    info = {"success": torch.tensor(success)}
    if terms is not None:
        info["reward_terms"] = torch.tensor(terms)
    return StepResult(
        obs=zeros,
        next_obs=zeros,
        reward=torch.tensor(reward),
        terminated=torch.tensor(done),
        truncated=torch.zeros(len(reward), dtype=torch.bool),
        cost=zeros,
        info=info,
    )


def test_a_restored_tracker_reports_what_the_original_would() -> None:
    original = EpisodeTracker(2, torch.device("cpu"))
    original.update(step([1.0, 2.0], [False, True], [True, False]))  # env 0 succeeded mid-episode
    restored = EpisodeTracker(2, torch.device("cpu"))
    restored.load_state_dict({k: v.clone() for k, v in original.state_dict().items()})
    for tracker in (original, restored):
        tracker.update(step([3.0, 4.0], [True, True], [False, True]))
    expected = original.pop()
    assert expected["episode_success"] == 2 / 3 and expected["episodes"] == 3
    assert restored.pop() == expected


def test_each_reward_term_is_logged_as_its_mean_episode_sum_and_survives_a_checkpoint() -> None:
    """Per term, the sum over each finished episode of its scaled share, averaged over those episodes."""
    original = EpisodeTracker(2, torch.device("cpu"), ("gain", "cost"))
    original.update(step([0.5, 1.5], [False, True], [False, False], [[1.0, -0.5], [2.0, -0.5]]))
    restored = EpisodeTracker(2, torch.device("cpu"), ("gain", "cost"))
    restored.load_state_dict(original.state_dict())
    for tracker in (original, restored):
        tracker.update(step([2.5, 0.0], [True, True], [False, False], [[3.0, -0.5], [1.0, -1.0]]))
    expected = original.pop()
    # Episodes: env 1's first (2, -0.5), env 0's (1 + 3, -1), env 1's second (1, -1).
    assert expected["reward/gain"] == pytest.approx(7 / 3) and expected["reward/cost"] == pytest.approx(-2.5 / 3)
    assert expected["reward/gain"] + expected["reward/cost"] == pytest.approx(expected["episode_return"])
    assert restored.pop() == expected
    # A checkpoint written before the terms were logged resumes with their sums at zero.
    older = {key: value for key, value in original.state_dict().items() if key != "reward_terms"}
    EpisodeTracker(2, torch.device("cpu"), ("gain", "cost")).load_state_dict(older)


def test_terms_no_step_carried_are_not_logged_as_zeros() -> None:
    """A learner fed from the robot's stream knows the task's terms but gets no shares of them: it logs none,
    rather than a row of zeros that reads as a measured reward of nothing."""
    tracker = EpisodeTracker(2, torch.device("cpu"), ("gain", "cost"))
    tracker.update(step([0.5, 1.5], [True, True], [False, False]))
    assert not [key for key in tracker.pop() if key.startswith("reward/")]


def test_a_short_training_run_logs_every_reward_term(tmp_path: Path) -> None:
    overrides = [
        "env.task=hopper_velocity",
        "env.num_envs=2",
        "env.task_params.episode_length=10",
        "total_steps=40",
        "warmup_steps=40",  # no updates: the episodes alone are under test
        "eval_every=0",
        "checkpoint_every=0",
        "sac.actor_hidden=[8]",
        "sac.critic_hidden=[8]",
        "log.interval_steps=20",
        "log.tensorboard=false",
        f"log.root={tmp_path}",
        "log.name=run",
    ]
    train(load(TrainConfig, None, overrides))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [record for record in records if "episode_return" in record]
    assert logged
    for record in logged:
        terms = {key: value for key, value in record.items() if key.startswith("reward/")}
        assert set(terms) == {"reward/forward", "reward/healthy", "reward/control"}
        assert sum(terms.values()) == pytest.approx(record["episode_return"], rel=1e-5, abs=1e-5)
