"""`--record-video`: `q2real deploy --sim` hands it to the sim robot, which films its own run beside its
real-time loop, a late frame repeating the one before so the video keeps the run's clock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from q2real.cli.main import main
from q2real.gate import sim_robot
from q2real.gate.run_video import VIDEO_SIZE
from q2real.gate.sim_settings import SimRobotConfig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pendulum_run"


class Started(Exception):
    """Raised by a stand-in once it has seen what it was given."""


def test_deploy_hands_record_video_to_the_sim_robot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from q2real.deploy_ros import session
    from q2real.sim import filming

    given: dict = {}

    def deploy(bundle, config, **kwargs):
        given.update(kwargs)
        raise Started

    monkeypatch.setattr(session, "deploy", deploy)
    monkeypatch.setattr(filming, "check_rendering", lambda: None)
    video = str(tmp_path / "run.mp4")
    with pytest.raises(Started):
        main(["deploy", str(FIXTURE / "policy.onnx"), "--sim", "--record-video", video, "--shift", "payload=0.5"])
    assert given["sim_extra"] == ["--shift", "payload=0.5", "--shift-at", "0.0", "--record-video", video]


def test_record_video_without_sim_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", str(FIXTURE / "policy.onnx"), "--record-video", "run.mp4"]) == 2
    assert "--record-video: the sim robot films its run: it needs --sim" in capsys.readouterr().err


def test_the_sim_robot_reads_record_video_into_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SimRobotConfig] = []

    def robot(spec, config):
        seen.append(config)
        raise Started

    monkeypatch.setattr(sim_robot, "SimRobot", robot)
    with pytest.raises(Started):
        sim_robot.main(["pendulum", "--record-video", "run.mp4"])
    assert seen[0].record_video == "run.mp4"
    assert SimRobotConfig().record_video is None


@pytest.mark.slow  # opens a software GL context and encodes: 4 s on an idle 2-core machine, 11 s on a busy one
def test_a_frame_late_to_render_repeats_the_one_before(tmp_path: Path) -> None:
    # In a fresh interpreter, as the sim robot films: robosuite's import elsewhere in this process binds
    # OpenGL to another platform.
    script = f"""
import time
from q2real.gate.run_video import RunVideo
from q2real.hardware import robot_spec
from q2real.hardware.model import load_model
model = load_model(robot_spec("pendulum"))
video = RunVideo({str(tmp_path / "late.mp4")!r}, model, timestep=0.002, start=model.qpos0)
assert video.every == 20 and video.fps == 25.0  # a frame every 20 physics steps of 2 ms
video.offer(0, model.qpos0, ("first",))
deadline = time.monotonic() + 30
while video.rendered < 1 and time.monotonic() < deadline:
    time.sleep(0.01)
video.offer(4 * video.every, model.qpos0 + 1.0, ("fifth",))  # frames 1, 2 and 3 never came
print(video.close())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (
        f"sim robot: video {tmp_path / 'late.mp4'}: 5 frames, 0.2 s at 25 fps; rendering kept up with 2 of them, "
        "the other 3 repeat the frame before (a smaller video or a GPU renders faster)"
    )
    with av.open(str(tmp_path / "late.mp4")) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(frames) == 5 and frames[0].shape == (VIDEO_SIZE[1], VIDEO_SIZE[0], 3)
    difference = [float(np.abs(frames[i].astype(float) - frames[0]).mean()) for i in range(5)]
    assert max(difference[:4]) < 1.0 < difference[4], difference  # three repeats of the first, then the fifth


@pytest.mark.slow  # a 4 s deploy against the sim robot, which films it
def test_deploy_on_the_sim_robot_records_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROS_DOMAIN_ID", str(10 + os.getpid() % 80))  # apart from other tests' DDS traffic
    video = tmp_path / "run.mp4"
    argv = ["deploy", str(FIXTURE / "policy.onnx"), "--sim", "--duration", "4", "--record-video", str(video)]
    assert main([*argv, "shield.ramp_time=0.5"]) == 0
    printed = capfd.readouterr().out
    assert f"sim robot: video {video}: " in printed, printed[-2000:]
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        assert float(stream.average_rate or 0) == 25.0
        frames = list(container.decode(video=0))
    assert len(frames) >= 4 * 25 - 1, "the video is shorter than the run"
    assert (frames[0].width, frames[0].height) == VIDEO_SIZE
