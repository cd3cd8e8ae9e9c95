"""robosuite Lift and Door through the batched env API: worker processes, float32 observations,
truncation with the true final observation, success flags, episode success in the training logs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "robosuite",
    reason="robosuite is not installed: pip install 'q2real[robosuite]' && pip install --no-deps robosuite==1.5.2",
)

from q2real.agents.common.episodes import EpisodeTracker  # noqa: E402
from q2real.sim import make  # noqa: E402

pytestmark = pytest.mark.slow  # robosuite worker processes


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("task", "object_dim"), [("Lift", 10), ("Door", 14)])
def test_robosuite_task_creates_resets_and_steps_through_the_batched_api(task: str, object_dim: int) -> None:
    env = make(task=f"robosuite:{task}", num_envs=3, device="cpu", task_params={"horizon": 6})
    try:
        assert env.obs_names == ("robot0_proprio-state", "object-state")
        assert env.obs_dims == (50, object_dim) and env.action_dim == 7 and env.control_period == 0.05
        obs = env.reset()
        assert obs.shape == (3, 50 + object_dim) and obs.dtype == torch.float32
        tracker = EpisodeTracker(3, torch.device("cpu"))
        for step in range(6):
            result = env.step(torch.rand(3, 7) * 2 - 1)
            tracker.update(result)
            assert result.obs.dtype == result.next_obs.dtype == torch.float32
            assert torch.isfinite(result.reward).all() and (result.reward >= 0).all()
            assert result.info["success"].dtype == torch.bool and result.info["success"].shape == (3,)
            assert not result.terminated.any()
            assert bool(result.truncated.all()) == (step == 5), "episodes end exactly at the horizon"
        # After the horizon the envs reset: `obs` is a fresh episode, `next_obs` the final state.
        assert not torch.equal(result.obs, result.next_obs)
        logged = tracker.pop()
        assert logged["episodes"] == 3 and logged["episode_length"] == 6 and logged["episode_success"] == 0.0
    finally:
        env.close()


def test_unknown_robosuite_task_fails_with_the_worker_error() -> None:
    with pytest.raises(RuntimeError, match="NotATask"):
        make(task="robosuite:NotATask", num_envs=1, device="cpu")
