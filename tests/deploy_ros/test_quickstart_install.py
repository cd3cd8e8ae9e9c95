"""The path from a run to a robot, from a quick-start-only install, as a newcomer runs it.

A fresh virtual environment gets exactly what the quick start installs (`pip install torch==2.13.0 -e .`:
no JAX, no ROS 2, no test tooling), and its `q2real` console script then trains, exports, gates (on native
MuJoCo, said so, since MJX is absent), deploys on the sim robot, and is started, watched and stopped from a
second shell with `q2real operator`, each step checked by what it prints and how it exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _operator(q2real: Path, request: str, cwd: Path) -> subprocess.CompletedProcess:
    return _run(q2real, "operator", request, "--loopback", "--timeout", "10", cwd=cwd, timeout=60)


def _until(check, seconds: float, what: str) -> str:
    deadline = time.monotonic() + seconds
    last = ""
    while time.monotonic() < deadline:
        ok, last = check()
        if ok:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what} within {seconds:g} s; last: {last}")


@pytest.mark.slow  # a virtual environment from the wheels (about 50 s), a short training run, a deployment
@pytest.mark.timeout(1200)
def test_the_path_to_a_robot_runs_from_the_quick_start_install(tmp_path: Path, dds_domain: int) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-compile: no byte-compiling of every module of torch at install; the modules the steps below
    # import are compiled as they are imported, as they would be for a user.
    pip = [venv / "bin" / "pip", "install", "-q", "--no-compile", "torch==2.13.0", "-e", ROOT]
    installed = _run(*pip, cwd=tmp_path, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    absent = _run(
        venv / "bin" / "python",
        "-c",
        "import importlib.util as u; print([n for n in ('jax', 'rclpy', 'pytest', 'playground') if u.find_spec(n)])",
        cwd=tmp_path,
    )
    assert absent.stdout.strip() == "[]", "the quick start installed test tooling: " + absent.stdout
    q2real, work = venv / "bin" / "q2real", tmp_path / "work"
    work.mkdir()

    train = _run(
        q2real,
        "train",
        "total_steps=1500",
        "warmup_steps=500",
        "eval_every=0",
        "eval_envs=2",
        "log.name=run",
        "log.tensorboard=false",
        cwd=work,
    )
    assert train.returncode == 0 and "final evaluation: mean return" in train.stdout, train.stderr[-3000:]
    run = work / "runs" / "run"
    exported = _run(q2real, "export", run, cwd=work)
    assert exported.returncode == 0 and (run / "policy.onnx").is_file(), exported.stderr
    gate = _run(q2real, "transfer", run, "--episodes", "4", "--only", "nominal", cwd=work)
    assert gate.returncode in (0, 1), gate.stderr[-3000:]
    assert "MJX is not installed" in gate.stdout and "rows run on mujoco" in gate.stdout
    assert gate.stdout.strip().splitlines()[-1].startswith(("gate PASSED", "gate FAILED"))
    assert "gate: 12/12 episodes (100%)" in gate.stderr

    # The node on the sim robot, waiting for an operator; the operator is a second shell.
    log = (tmp_path / "deploy.log").open("w")
    deploy = subprocess.Popen(
        [str(q2real), "deploy", str(run / "policy.onnx"), "--sim", "autostart=false"],
        cwd=work,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "ROS_DOMAIN_ID": str(dds_domain)},
    )
    try:

        def status(mode: str):
            answer = _operator(q2real, "status", work)
            return answer.returncode == 0 and f"mode {mode}" in answer.stdout, answer.stdout + answer.stderr

        _until(lambda: status("PASSIVE"), 60, "the node answers `q2real operator status` in PASSIVE")
        start = _operator(q2real, "start", work)
        assert start.returncode == 0, start.stdout + start.stderr
        _until(lambda: status("RUN"), 30, "the policy runs after `q2real operator start`")
        stop = _operator(q2real, "stop", work)
        assert stop.returncode == 0 and "mode ESTOP" in stop.stdout, stop.stdout + stop.stderr
        reset = _operator(q2real, "reset", work)
        assert reset.returncode == 0 and "mode PASSIVE" in reset.stdout, reset.stdout + reset.stderr
        deploy.send_signal(signal.SIGINT)  # Ctrl-C in the first shell, as the README has it
        assert deploy.wait(timeout=60) == 0
    finally:
        if deploy.poll() is None:
            deploy.kill()
            deploy.wait()
        log.close()
    console = (tmp_path / "deploy.log").read_text()
    for line in ("mode RAMP: operator start", "mode RUN", "mode ESTOP: operator stop", "mode PASSIVE"):
        assert line in console, console[-3000:]
    assert "stopped (Ctrl-C)" in console, console[-3000:]
