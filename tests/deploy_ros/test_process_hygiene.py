"""`q2real deploy --sim` never leaves its sim robot process behind: not when start-up fails after the
robot was spawned, and not when the deploying process itself is killed."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from q2real.cli.main import main
from q2real.configs.loader import ConfigError
from q2real.deploy_ros import session
from q2real.deploy_ros.session import deploy
from q2real.deploy_ros.settings import NodeConfig

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads processes from /proc")

SIM_ROBOT = b"q2real-sim-robot"


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:  # gone
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _alive(pid: int) -> bool:
    """Running, not just a zombie waiting for a parent (or an init that never reaps) to collect it."""
    state = _status(pid).get("State", "")
    return bool(state) and not state.startswith(("Z", "X"))


def _sim_robots(parent: int) -> list[int]:
    """Live sim robot processes whose parent is `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        pid = int(entry.name)
        if SIM_ROBOT in cmdline and _status(pid).get("PPid") == str(parent) and _alive(pid):
            found.append(pid)
    return found


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch, dds_domain: int):
    """The sim robots `deploy` starts in this test; any still alive at teardown are killed, so that a
    failing test cannot leave a robot on the wire for the tests after it."""
    processes: list[subprocess.Popen] = []
    start = session.start_sim_robot

    def recording(*args, **kwargs):
        processes.append(start(*args, **kwargs))
        return processes[-1]

    monkeypatch.setattr(session, "start_sim_robot", recording)
    yield processes
    for pid in [p.pid for p in processes] + _sim_robots(os.getpid()):
        _kill(pid)
    for process in processes:
        process.wait(10)


def _config(**fields) -> NodeConfig:
    return NodeConfig(autostart=True, startup_timeout=20.0, **fields)


def _deploy(bundle: Path, config: NodeConfig) -> None:
    """`q2real deploy --sim`, bounded so that a start-up that wrongly succeeds ends the test instead of hanging it."""
    deploy(bundle, config, sim=True, duration=5.0, status_every=None)


def test_a_record_path_under_a_file_stops_the_sim_robot(pendulum_bundle, spawned, tmp_path):
    (tmp_path / "notes").write_text("")
    with pytest.raises(NotADirectoryError, match="notes"):
        _deploy(pendulum_bundle, _config(record=str(tmp_path / "notes" / "bag")))
    assert spawned, "the failure should come after the robot was started"
    assert not [p.pid for p in spawned if _alive(p.pid)] and not _sim_robots(os.getpid())


def test_an_existing_bag_stops_the_sim_robot(pendulum_bundle, spawned, tmp_path):
    (tmp_path / "bag").mkdir()
    with pytest.raises(ConfigError, match="record: .*already there"):
        _deploy(pendulum_bundle, _config(record=str(tmp_path / "bag")))
    assert spawned, "the failure should come after the robot was started"
    assert not [p.pid for p in spawned if _alive(p.pid)] and not _sim_robots(os.getpid())


@pytest.mark.parametrize(("topic", "name"), [("command", "/bad//name"), ("joint_states", "x/")])
def test_an_invalid_topic_name_leaves_no_sim_robot(pendulum_bundle, spawned, topic, name):
    config = _config()
    setattr(config.topics, topic, name)
    with pytest.raises(ValueError, match="topic"):
        _deploy(pendulum_bundle, config)
    assert not [p.pid for p in spawned if _alive(p.pid)] and not _sim_robots(os.getpid())


def test_no_joint_state_within_the_startup_timeout_stops_the_sim_robot(pendulum_bundle, spawned):
    config = _config()
    config.startup_timeout = 0.01  # the robot is still starting
    with pytest.raises(TimeoutError, match="no joint state"):
        _deploy(pendulum_bundle, config)
    assert spawned, "the failure should come after the robot was started"
    assert not [p.pid for p in spawned if _alive(p.pid)] and not _sim_robots(os.getpid())


@pytest.mark.parametrize(
    ("bundle", "command", "expected"),
    [
        ("spot_bundle", ["0.5", "0.1"], "reads 3 command values (forward, lateral, yaw rate), got 2: 0.5 0.1"),
        ("panda_bundle", ["0.5", "0.1"], "reads 3 command values (target[0], target[1], target[2]), got 2: 0.5 0.1"),
        ("pendulum_bundle", ["0.5"], "reads no task command; leave --command out"),
    ],
)
def test_a_command_the_policy_cannot_read_is_refused_before_the_sim_robot_starts(
    request, spawned, capsys, bundle, command, expected
):
    """One error naming the flag, not the sim robot's error followed by the node's wait for joint states."""
    path = request.getfixturevalue(bundle)
    assert main(["deploy", str(path), "--sim", "--duration", "5", "--command", *command]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"q2real deploy: error: --command: the policy of {path} {expected}"
    assert not spawned


@pytest.mark.slow
def test_the_sim_robot_exits_when_q2real_deploy_is_killed(pendulum_bundle, dds_domain, tmp_path):
    command = [sys.executable, "-m", "q2real.cli.main", "deploy", str(pendulum_bundle), "--sim", "--duration", "60"]
    rng = random.Random()
    for trial in range(3):
        delay = rng.uniform(0.0, 1.5)  # while the robot starts up, and once it publishes
        lived = _kill_deploy(command, delay, tmp_path / f"deploy{trial}.log")
        assert lived <= 5.0, f"the sim robot lived {lived:.1f} s after a SIGKILL of its parent {delay:.2f} s in"


def _kill_deploy(command: list[str], delay: float, log: Path) -> float:
    """Start `q2real deploy --sim`, SIGKILL it `delay` s after its sim robot appears; return the seconds the
    robot lived on after the kill (inf if it was still running 10 s later)."""
    with log.open("wb") as out:
        parent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    robots: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not (robots := _sim_robots(parent.pid)) and parent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert robots, f"no sim robot appeared; deploy said:\n{log.read_text()}"
        time.sleep(delay)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        killed = time.monotonic()
        gone = _wait_until(lambda: not _alive(robots[0]), 10)
        return time.monotonic() - killed if gone else float("inf")
    finally:
        _kill(parent.pid)
        parent.wait(10)
        for pid in robots:
            _kill(pid)
