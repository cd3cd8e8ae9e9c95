"""Episode bookkeeping survives a checkpoint: success rates included, not only returns and lengths."""

from __future__ import annotations

import torch

from q2real.agents.common.episodes import EpisodeTracker
from q2real.sim.vec_env import StepResult


def step(reward: list[float], done: list[bool], success: list[bool]) -> StepResult:
    zeros = torch.zeros(len(reward))
    return StepResult(
        obs=zeros,
        next_obs=zeros,
        reward=torch.tensor(reward),
        terminated=torch.tensor(done),
        truncated=torch.zeros(len(reward), dtype=torch.bool),
        cost=zeros,
        info={"success": torch.tensor(success)},
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
