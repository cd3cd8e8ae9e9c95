"""`q2real render`: a bundle or a run directory filmed to an MP4 that plays back as many frames, of the
size asked for, as the film recorded; a GIF beside it on request."""

from __future__ import annotations

from pathlib import Path

import av
import pytest
from PIL import Image

from q2real.cli.main import main
from tests.conftest import q2real_cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pendulum_run"


def decoded(path: Path) -> tuple[int, tuple[int, int], float]:
    """Frames, (width, height) and frame rate of an MP4, decoded back with PyAV."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        rate = float(stream.average_rate or 0)
    assert frames, f"{path}: no frames decoded"
    return len(frames), (frames[0].shape[1], frames[0].shape[0]), rate


@pytest.mark.slow  # two rollouts and 60 rendered frames with software EGL: about 10 s
def test_render_writes_a_playable_mp4_of_the_frames_and_size_asked_for(tmp_path: Path) -> None:
    out = tmp_path / "pendulum.mp4"
    argv = ["render", str(FIXTURE / "policy.onnx"), "--out", str(out), "--seconds", "1.2"]
    done = q2real_cli(*argv, "--width", "160", "--height", "120", "--gif")
    assert done.returncode == 0, done.stderr[-2000:]
    # 1.2 s of a 50 Hz task at 25 fps: every second control step, 30 frames; the episode runs on.
    assert decoded(out) == (30, (160, 120), 25.0)
    with Image.open(out.with_suffix(".gif")) as gif:
        assert gif.n_frames == 15 and gif.size == (160, 120)  # 12.5 fps at most
    assert f"video: {out} (30 frames, 160x120 at 25 fps)" in done.stdout
    films = tmp_path / "run"
    argv = ["render", str(FIXTURE), "--out", str(films / "two.mp4"), "--seconds", "0.6", "--episodes", "2"]
    done = q2real_cli(*argv, "--width", "96", "--height", "64", "--fps", "10")
    assert done.returncode == 0, done.stderr[-2000:]
    # From the run's checkpoint: two episodes of 0.6 s at 10 fps (every fifth step), one after the other.
    assert decoded(films / "two.mp4") == (12, (96, 64), 10.0)


def test_render_refuses_what_it_cannot_film(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(tmp_path / "missing.onnx")]) == 2
    assert "expected a training run directory or a policy bundle (.onnx file)" in capsys.readouterr().err
    assert main(["render", str(FIXTURE / "policy.onnx"), "--width", "161"]) == 2
    assert "--width/--height: expected even sizes of at least 16 px, got 161x480" in capsys.readouterr().err
    assert main(["render", str(FIXTURE / "policy.onnx"), "--out", str(tmp_path / "film.avi")]) == 2
    assert f"--out {tmp_path / 'film.avi'}: expected a path ending in .mp4" in capsys.readouterr().err
