"""`log.video`: a training run films the first episode of each evaluation to `videos/step_<N>.mp4`; off
by default, and a run that could not film says so before it trains."""

from __future__ import annotations

from pathlib import Path

import av
import pytest

from q2real.agents.config import TrainConfig
from q2real.agents.train import train
from q2real.configs.loader import ConfigError, load
from q2real.sim.filming import HOLD_SECONDS
from tests.conftest import q2real_cli


def test_log_video_is_off_by_default_and_a_misspelt_key_is_an_error() -> None:
    assert load(TrainConfig).log.video is False
    assert load(TrainConfig, None, ["log.video=true"]).log.video is True
    with pytest.raises(ConfigError, match="log.vidoe: unknown key"):
        load(TrainConfig, None, ["log.vidoe=true"])


def test_an_adapter_run_asking_for_video_stops_before_it_trains(tmp_path: Path) -> None:
    config = load(
        TrainConfig,
        None,
        ["env.task=gymnasium:Pendulum-v1", "env.num_envs=1", "log.video=true", f"log.root={tmp_path}"],
    )
    with pytest.raises(ConfigError, match="log.video: films q2real's own tasks"):
        train(config)
    assert not list(tmp_path.glob("*/checkpoint.pt")), "it trained"


@pytest.mark.slow  # a 400-step training run with two filmed evaluations: about 8 s
def test_each_evaluation_is_filmed_to_the_run_directory(tmp_path: Path) -> None:
    done = q2real_cli(
        "train",
        "env.task=pendulum_swingup",
        "env.num_envs=2",
        "env.task_params.episode_length=30",
        "total_steps=400",
        "warmup_steps=100",
        "eval_every=200",
        "eval_envs=2",
        "sac.actor_hidden=[32,32]",
        "sac.critic_hidden=[32,32]",
        "sac.batch_size=32",
        f"log.root={tmp_path}",
        "log.name=filmed",
        "log.tensorboard=false",
        "log.video=true",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "filmed"
    videos = sorted(p.name for p in (run / "videos").iterdir())
    assert videos == ["step_200.mp4", "step_400.mp4"]
    with av.open(str(run / "videos" / "step_400.mp4")) as container:
        frames = list(container.decode(video=0))
    # 30 steps at 50 Hz filmed at 25 fps (steps 2, ..., 28; the 30th starts the next episode), then held.
    assert len(frames) == 14 + round(HOLD_SECONDS * 25)
    assert (frames[0].width, frames[0].height) == (320, 240)
