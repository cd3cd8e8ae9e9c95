from __future__ import annotations

import io
import sys
import types
from pathlib import Path

import pytest
import torch

from q2real.agents.common.episodes import EpisodeTracker
from q2real.agents.common.metrics import RETURNS, MetricLogger, Panel, plot_curves, read_metrics, write_csv
from q2real.agents.common.progress import Progress
from q2real.agents.common.run_dir import LogConfig, RunDir, wandb_credentials
from q2real.sim.vec_env import StepResult


def _result(reward, done):
    reward = torch.tensor(reward, dtype=torch.float32)
    done = torch.tensor(done)
    return StepResult(reward[:, None], reward[:, None], reward, done, torch.zeros_like(done), reward * 0.5)


def test_episode_tracker_reports_means_of_finished_episodes() -> None:
    tracker = EpisodeTracker(2, torch.device("cpu"))
    tracker.update(_result([1.0, 2.0], [False, True]))
    tracker.update(_result([3.0, 5.0], [True, False]))
    stats = tracker.pop()
    # training_cost: every step's cost (half the reward here), finished episodes or not.
    assert stats == {
        "episode_return": 3.0,
        "episode_cost": 1.5,
        "episode_length": 1.5,
        "episodes": 2,
        "training_cost": 5.5,
    }
    assert tracker.pop() == {}
    tracker.update(_result([1.0, 1.0], [False, True]))
    stats = tracker.pop()
    assert stats["episode_return"] == 6.0  # env 1: 5 + 1 over its second episode
    assert stats["training_cost"] == 6.5  # cumulative over the run


def test_metrics_survive_a_torn_last_line_and_plot(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "wall_time": 0.1, "episode_return": 1.0}\n{"step": 2, "wall_time": 0.2, "episode_ret')
    records = read_metrics(path)
    assert records == [{"step": 1, "wall_time": 0.1, "episode_return": 1.0}]
    write_csv(records + [{"step": 3, "wall_time": 0.3, "loss": 2.0}], tmp_path / "m.csv")
    assert (tmp_path / "m.csv").read_text().splitlines()[0] == "step,wall_time,episode_return,loss"
    assert plot_curves(records, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert not plot_curves([{"step": 1, "wall_time": 0.0}], tmp_path / "none.png")


def test_curves_show_what_each_run_kind_optimizes(tmp_path: Path) -> None:
    """A safe run plots its cost against the limit; a BC run its losses by epoch, not one dot."""
    safe = [{"step": s, "wall_time": s / 10, "episode_return": s, "episode_cost": 30 - s} for s in (1, 2, 3)]
    cost = Panel("episode cost", ("episode_cost", "eval_cost"), limit=25.0)
    assert plot_curves(safe, tmp_path / "safe.png", (RETURNS, cost))
    bc = [{"step": e, "wall_time": e, "bc/train_loss": 1 / e, "bc/val_loss": 1.2 / e} for e in (1, 2, 3)]
    assert not plot_curves(bc, tmp_path / "default.png")  # returns alone: nothing a BC run logs
    assert plot_curves(bc, tmp_path / "bc.png", (Panel("loss", ("bc/train_loss", "bc/val_loss")),), "epochs")
    import matplotlib.image

    # Two rows of axes are taller than one.
    assert (
        matplotlib.image.imread(tmp_path / "safe.png").shape[0] > matplotlib.image.imread(tmp_path / "bc.png").shape[0]
    )


def test_progress_prints_plain_lines_when_not_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress(100, "demo", stream=stream, plain_interval_s=0.0)
    progress.update(50, episode_return=1.5)
    progress.update(50)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("demo: 50/100 steps (50%)") and "steps/s" in lines[0] and "ETA" in lines[0]
    assert "episode_return=1.5" in lines[0] and lines[-1].startswith("demo: 100/100 steps (100%)")


def test_progress_without_a_total_counts_with_no_share_or_eta() -> None:
    """A learner on a robot's stream runs until it is stopped: no 0 % of a made-up total, no ETA."""
    stream = io.StringIO()
    progress = Progress(None, "robot learner", stream=stream, plain_interval_s=0.0, unit="transition")
    progress.update(1500, episode_return=2.0)
    progress.update(500)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("robot learner: 1,500 transitions  ") and "transitions/s" in lines[0]
    assert lines[-1].startswith("robot learner: 2,000 transitions") and "episode_return=2" in lines[-1]
    assert not any("ETA" in line or "%" in line for line in lines)


def test_progress_never_counts_past_its_total() -> None:
    """Eight envs can finish more episodes in one step than were left to record."""
    stream = io.StringIO()
    progress = Progress(20, "recording", stream=stream, plain_interval_s=0.0, unit="episode")
    progress.update(16)
    progress.update(8)
    last = stream.getvalue().splitlines()[-1]
    assert progress.done == 20 and last.startswith("recording: 20/20 episodes (100%)") and "ETA 0 s" in last


def test_wandb_credentials_are_an_api_key_or_the_netrc_entry_of_its_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    assert not wandb_credentials()  # no file
    netrc.write_text("machine example.org login user password secret\n")
    assert not wandb_credentials()  # another host's login
    netrc.write_text("machine api.wandb.ai login user password secret\n")
    assert wandb_credentials()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert not wandb_credentials()  # a self-hosted server needs its own login
    monkeypatch.setenv("WANDB_API_KEY", "key")
    assert wandb_credentials()


def test_an_offline_wandb_run_says_where_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[dict] = []

    def init(**kwargs):
        started.append(kwargs)
        files = Path(kwargs["dir"]) / "wandb" / "offline-run-1" / "files"
        return types.SimpleNamespace(dir=str(files), log=lambda *a, **k: None, finish=lambda: None)

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    log = LogConfig(root=str(tmp_path), name="r", tensorboard=False, wandb="offline")
    run = RunDir({"seed": 0}, log, "task")
    MetricLogger(run, log).close()
    assert started[0]["mode"] == "offline"
    where = tmp_path / "r" / "wandb" / "offline-run-1"
    assert f"wandb: offline run written to {where}; upload it with: wandb sync {where}" in capsys.readouterr().out
