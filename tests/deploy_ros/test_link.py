"""The robot-to-learner link over loopback gRPC: what the robot accepts from a learner, the mirror of
the ring, a session with a real learner process over mutual TLS (rows in order, drops counted,
rewards and rollbacks relayed), and `deploy --learner` against the sim robot swapping the versions a
remote learner sends."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from q2real.configs.loader import ConfigError, load
from q2real.contracts.transitions import CANDIDATE, GOOD, READY, RING, ROLLBACK, RUN, TransitionRing
from q2real.deploy_ros.learning import link
from q2real.deploy_ros.learning import link_pb2 as pb
from q2real.deploy_ros.learning.link import Receiver, Relay, Tls, serve
from q2real.deploy_ros.session import deploy
from q2real.deploy_ros.settings import NodeConfig
from tests.conftest import FIXTURE_RUN

LEARNING = Path(link.__file__).parent


def test_the_committed_protobuf_module_is_generated_from_link_proto(tmp_path: Path) -> None:
    protoc = [sys.executable, "-m", "grpc_tools.protoc", f"-I{LEARNING}", f"--python_out={tmp_path}"]
    subprocess.run([*protoc, f"--pyi_out={tmp_path}", str(LEARNING / "link.proto")], check=True)
    for name in ("link_pb2.py", "link_pb2.pyi"):
        assert (tmp_path / name).read_text() == (LEARNING / name).read_text(), (
            f"{name} is stale: regenerate it with the command at the top of link.proto"
        )


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["finetune.learner_address=workstation"], "finetune.learner_address"),
        (["finetune.learner_address=workstation:0"], "finetune.learner_address"),
        (["finetune.learner_address=workstation:70000"], "finetune.learner_address"),
        (["finetune.learner_address=work station:50051"], "finetune.learner_address"),
        (["finetune.learner_address=::1:50051"], "finetune.learner_address"),
        (["finetune.learner_address=h:1", "finetune.run=elsewhere"], "finetune.learner_address"),
        (["finetune.learner_address=h:1", "finetune.learner=[actor_start=5]"], "finetune.learner_address"),
        (["finetune.run=r", "finetune.tls_root=ca.pem"], "finetune.tls_"),
        (["finetune.learner_address=h:1", "finetune.tls_cert=c.pem", "finetune.tls_root=ca.pem"], "finetune.tls_cert"),
        (["finetune.learner_address=h:1", "finetune.tls_cert=c.pem", "finetune.tls_key=k.pem"], "finetune.tls_cert"),
    ],
)
def test_the_remote_learners_settings_are_checked_by_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load(NodeConfig, None, overrides)


def test_an_ipv6_learner_address_is_accepted() -> None:
    config = load(NodeConfig, None, ["finetune.learner_address='[::1]:50051'"])  # quoted: YAML reads [ as a list
    assert config.finetune.enabled and config.finetune.run is None


def _rows(ring: TransitionRing, ticks: range, flags: int) -> None:
    for tick in ticks:
        obs = np.array([np.cos(tick / 10), np.sin(tick / 10), tick % 7 - 3.0])
        ring.append(tick, obs, np.array([np.sin(tick)]), np.array([tick / 100]), np.array([np.cos(tick)]), 0, flags)


def test_the_mirror_holds_rows_at_the_robots_indices_and_blanks_the_lost_ones(tmp_path: Path) -> None:
    robot = TransitionRing(tmp_path / "robot", 16, 3, 1, 1, create=True)
    mirror = TransitionRing(tmp_path / "mirror", 16, 3, 1, 1, create=True)
    _rows(robot, range(40), RUN)
    mirror.put(0, robot.rows[:4].copy())  # rows 0-3 (slots 0-3) before the robot lapped the ring
    mirror.put(30, robot.rows[np.arange(30, 34) % 16].copy())  # rows 4-29 lost on the way
    assert mirror.head == 34
    lost = np.arange(34 - 16, 30) % 16
    assert (mirror.rows["flags"][lost] == 0).all() and np.isnan(mirror.rewards[lost]).all()
    np.testing.assert_array_equal(mirror.rows["tick"][np.arange(30, 34) % 16], np.arange(30, 34))
    rows, after = mirror.read(18)
    assert after == 34 and not (rows["flags"][:-4] & RUN).any()  # nothing stale reads as a transition
    with pytest.raises(ValueError, match="after row 34"):
        mirror.put(33, robot.rows[:1].copy())  # out of order


@pytest.fixture()
def receiver(tmp_path: Path) -> Receiver:
    ring = TransitionRing(tmp_path / RING, 8, 3, 1, 1, create=True)
    _rows(ring, range(5), RUN)
    return Receiver(tmp_path, ring)


def _send(receiver: Receiver, name: str, data: bytes, offset: int = 0, last: bool = True) -> None:
    receiver.chunk(pb.FileChunk(name=name, offset=offset, data=data, last=last))


def test_a_version_is_announced_only_once_its_files_arrived_whole(receiver: Receiver, tmp_path: Path) -> None:
    _send(receiver, "v0001.onnx", b"abc", last=False)
    receiver.candidate(pb.Candidate(version=1, step=7))
    assert not (tmp_path / CANDIDATE).exists() and receiver.refused == 1
    _send(receiver, "v0001.onnx", b"def", offset=3)
    _send(receiver, "v0001.probe.npz", b"probe")
    receiver.candidate(pb.Candidate(version=1, step=7))
    assert (tmp_path / "v0001.onnx").read_bytes() == b"abcdef"
    assert json.loads((tmp_path / CANDIDATE).read_text()) == {
        "version": 1, "bundle": "v0001.onnx", "probe": "v0001.probe.npz", "step": 7
    }  # fmt: skip
    assert not list(tmp_path.glob(".*.part"))


@pytest.mark.parametrize(
    "name", ["../v0001.onnx", "/tmp/v0001.onnx", "v0000.onnx", "v0001.onnx.sh", "v1.onnx", "transitions.ring", ""]
)
def test_files_a_learner_may_not_write_are_refused(receiver: Receiver, tmp_path: Path, name: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    _send(receiver, name, b"x")
    assert receiver.refused == 1 and sorted(p.name for p in tmp_path.iterdir()) == before
    assert not (tmp_path.parent / "v0001.onnx").exists()


def test_out_of_order_oversized_and_repeated_files_are_refused(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _send(receiver, "v0002.onnx", b"abc", offset=5)  # a chunk that skips bytes
    _send(receiver, "v0003.onnx", b"abc", last=False)
    _send(receiver, "v0003.onnx", b"abc", offset=0)  # a restart without finishing: the partial file goes
    monkeypatch.setattr(link, "FILE_MAX", 4)
    _send(receiver, "v0004.onnx", b"abcde")
    monkeypatch.undo()
    _send(receiver, "v0005.onnx", b"good")
    _send(receiver, "v0005.onnx", b"evil")  # versions are immutable
    assert receiver.refused == 4
    assert [p.name for p in tmp_path.glob("v*")] == ["v0005.onnx"] and (tmp_path / "v0005.onnx").read_bytes() == b"good"
    assert not list(tmp_path.glob(".*.part"))


def test_rewards_only_for_rows_the_node_wrote(receiver: Receiver) -> None:
    ring = receiver.ring
    receiver.rewards(pb.Rewards(start=0, values=np.arange(4, dtype="<f4").tobytes()))
    assert ring.rewarded == 4
    for start, values in ((3, np.ones(3, "<f4").tobytes()), (-1, np.ones(1, "<f4").tobytes()), (0, b"\x00" * 5)):
        receiver.rewards(pb.Rewards(start=start, values=values))
    assert receiver.refused == 3 and ring.rewarded == 4
    np.testing.assert_array_equal(ring.rewards[:4], np.arange(4))


def _certificates(folder: Path) -> dict[str, str]:
    """A throwaway CA and the learner's (localhost) and the robot's certificates it signs."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command makes the test certificates; it is not installed")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=folder)

    run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=q2real test CA")
    for name in ("learner", "robot"):
        run("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (folder / f"{name}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext")  # fmt: skip
    return {item: str(folder / item) for item in ("ca.pem", "learner.pem", "learner.key", "robot.pem", "robot.key")}


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds:g} s: {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_session_over_mutual_tls_streams_rows_in_order_counts_drops_and_relays_rewards_rollbacks_and_verdicts(
    tmp_path: Path,
) -> None:
    pem = _certificates(tmp_path)
    relay = Relay(tmp_path / "learner", str(FIXTURE_RUN), ("warmup_steps=20",), publish_every=3600.0, startup=120.0)
    server, port = serve("127.0.0.1:0", relay, Tls(pem["ca.pem"], pem["learner.pem"], pem["learner.key"]))
    robot_dir = tmp_path / "robot"
    robot_dir.mkdir()
    ring = TransitionRing(robot_dir / RING, 64, 3, 1, 1, create=True)
    _rows(ring, range(200), 0)  # before the link is up: more than the ring holds, so 136 are lost
    command = [sys.executable, "-m", "q2real.deploy_ros.learning.link", "connect", str(robot_dir), "--learner"]
    command += [f"localhost:{port}", "--tls-root", pem["ca.pem"], "--tls-cert", pem["robot.pem"]]
    client = subprocess.Popen([*command, "--tls-key", pem["robot.key"]], stdout=subprocess.PIPE, text=True)
    try:
        _wait(lambda: (robot_dir / READY).exists() or client.poll() is not None, 90, "the learner is ready")
        assert client.poll() is None, client.communicate()[0]
        (session,) = (tmp_path / "learner").glob("robot-*")
        for start in range(200, 500, 10):  # the node's pace while the ring keeps ahead of the link
            _rows(ring, range(start, start + 10), RUN)
            time.sleep(0.01)
        _wait(lambda: relay.received == 64 + 300, 20, f"all rows in ({relay.received})")
        assert relay.dropped == 136
        mirror = TransitionRing(session / RING)
        recent = np.arange(500 - 64, 500) % 64
        assert mirror.head == 500
        for field in ring.dtype.names or ():
            np.testing.assert_array_equal(mirror.rows[field][recent], ring.rows[field][recent], err_msg=field)
        # The learner's rewards come back for every transition it paired (the last row starts none yet).
        _wait(lambda: ring.rewarded == 499, 30, f"rewards back ({ring.rewarded})")
        rewarded = np.arange(499 - 63, 499) % 64
        assert np.isfinite(ring.rewards[rewarded]).all()
        np.testing.assert_array_equal(ring.rewards[rewarded], mirror.rewards[rewarded])
        # The node's rollback reaches the learner's directory, where the learner reloads that actor.
        note = {"version": 0, "refused": 1, "reason": "worse by 30%"}
        (robot_dir / ROLLBACK).write_text(json.dumps(note))
        _wait(lambda: (session / ROLLBACK).is_file(), 10, "the rollback relayed")
        assert json.loads((session / ROLLBACK).read_text()) == note
        # So does the version it judges good, the learner's anchor; one it never made does not.
        (robot_dir / GOOD).write_text(json.dumps({"version": 7}))
        time.sleep(1.0)
        assert not (session / GOOD).exists(), "a version the learner never made is not relayed"
        (robot_dir / GOOD).write_text(json.dumps({"version": 0}))
        _wait(lambda: (session / GOOD).is_file(), 10, "the good version relayed")
        assert json.loads((session / GOOD).read_text()) == {"version": 0}
        learner_pid = json.loads((session / READY).read_text())["pid"]
    finally:
        client.terminate()
        output = client.communicate(timeout=30)[0]
    assert client.returncode == 0, output
    assert "364 rows sent, 136 lost" in output
    _wait(lambda: not _alive(learner_pid), 40, "the learner stops when the robot leaves")
    server.stop(grace=1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_robot_without_the_learners_ca_is_not_connected(tmp_path: Path) -> None:
    pem = _certificates(tmp_path)
    relay = Relay(tmp_path / "learner", str(FIXTURE_RUN), (), publish_every=5.0, startup=5.0)
    server, port = serve("127.0.0.1:0", relay, Tls(None, pem["learner.pem"], pem["learner.key"]))
    try:
        robot_dir = tmp_path / "robot"
        robot_dir.mkdir()
        TransitionRing(robot_dir / RING, 8, 3, 1, 1, create=True)
        # Plain TCP to a TLS learner: the session never starts, and the client says so.
        status = link.main(["connect", str(robot_dir), "--learner", f"localhost:{port}"])
        assert status == 3 and relay.sessions == 0 and not (robot_dir / READY).exists()
    finally:
        server.stop(grace=0)


@pytest.mark.slow
def test_deploy_with_a_remote_learner_swaps_in_the_versions_it_sends(tmp_path: Path) -> None:
    """`q2real learn --serve` in its own process, as on a workstation (in this process its threads
    would share the node's interpreter lock), and `deploy --learner` against the sim robot."""
    command = [sys.executable, "-m", "q2real.cli.main", "learn", "--serve", "127.0.0.1:0", str(FIXTURE_RUN)]
    command += ["--directory", str(tmp_path / "learner"), "--publish-every", "2"]
    command += ["warmup_steps=100", "actor_start=300", "log.interval_steps=200"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = server.stdout.readline() if server.stdout else ""
        port = re.search(r"connects to port (\d+)", first)
        assert port, first + server.communicate(timeout=10)[0]
        overrides = ["autostart=true", f"finetune.learner_address=127.0.0.1:{port.group(1)}", "finetune.segment=50"]
        config = load(NodeConfig, None, [*overrides, f"finetune.directory={tmp_path / 'robot'}"])
        duration = 25.0
        summary = deploy(FIXTURE_RUN / "policy.onnx", config, sim=True, duration=duration, status_every=None)
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    tuned = summary.finetune
    assert tuned is not None and tuned["swaps"] >= 1 and tuned["refused"] == 0, (tuned, output)
    (session,) = (tmp_path / "learner").glob("robot-*")
    sent = sorted(p.name for p in (tmp_path / "robot").glob("v*.onnx") if p.name != "v0000.onnx")
    assert sent and all((tmp_path / "robot" / n).read_bytes() == (session / n).read_bytes() for n in sent)
    received = re.search(r"ended: (\d+) rows received, (\d+) dropped", output)
    assert received and int(received.group(2)) == 0 and int(received.group(1)) >= summary.run_ticks, output
    period = 0.02  # the loop kept its period beside the link (5 processes on 2 cores: 1.1% misses seen once)
    assert summary.ticks >= 0.9 * duration / period
    assert summary.loop_deadline_misses <= 0.02 * summary.ticks
