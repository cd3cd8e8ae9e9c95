"""Data-parallel training under torchrun on CPU (gloo): two ranks are one learner (identical weights,
temperature, targets, optimizer states and normalizer statistics over both ranks' rows), the averaged
gradient equals one process's on the concatenated batch, a 2-rank run resumes, a killed rank ends the
job, and two single-process "nodes" meet through a c10d rendezvous on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from q2real.agents.common.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow  # each case starts torchrun and two training processes

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TRAIN = [
    "-m", "q2real.cli.main", "train", "warmup_steps=400", "env.num_envs=2", "eval_envs=2", "eval_every=0",
    "checkpoint_every=800", "log.interval_steps=400", "log.tensorboard=false", "replay_capacity=4000",
]  # fmt: skip
ENV = os.environ | {"OMP_NUM_THREADS": "1", "Q2REAL_DIST_TIMEOUT": "30"}


def _torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    out = subprocess.run([*TORCHRUN, *args], capture_output=True, text=True, timeout=timeout, env=ENV)
    return out


def _assert_one_learner(a: dict, b: dict) -> None:
    """The two ranks' checkpoints hold the same learner and different experience."""
    assert a["step"] == b["step"] and a["updates"] == b["updates"] > 0
    for key, value in a["agent"].items():  # actor, critics, targets, log_alpha, normalizer buffers
        assert torch.equal(value, b["agent"][key]), f"agent.{key} differs between ranks"
    for name, opt in a["optimizers"].items():
        for index, state in opt["state"].items():
            for key, value in state.items():
                assert torch.equal(value, b["optimizers"][name]["state"][index][key]), f"{name} {index} {key}"
    assert not torch.equal(a["replay"]["data"]["obs"], b["replay"]["data"]["obs"]), "ranks collected alike"


def test_two_ranks_train_as_one_learner_and_resume(tmp_path: Path) -> None:
    out = _torchrun(
        "--standalone", "--nproc-per-node=2", *TRAIN, "total_steps=1600", f"log.root={tmp_path}", "log.name=run"
    )
    assert out.returncode == 0, out.stderr[-4000:]
    run = tmp_path / "run"
    a, b = load_checkpoint(run / "checkpoint.pt"), load_checkpoint(run / "rank1" / "checkpoint.pt")
    assert a["step"] == 1600 and a["world"] == 2
    _assert_one_learner(a, b)
    # The normalizer saw every rank's rows: its statistics are those of both replays together.
    rows = torch.cat([s["replay"]["data"]["next_obs"][: s["replay"]["size"]].flatten(0, 1) for s in (a, b)])
    assert rows.shape[0] == 1600
    assert torch.allclose(a["agent"]["obs_norm.mean"], rows.mean(0), atol=1e-4)
    assert torch.allclose(a["agent"]["obs_norm.var"], rows.var(0, unbiased=False), rtol=1e-3, atol=1e-4)
    assert out.stdout.count("final evaluation") == 1

    alone = subprocess.run(
        [sys.executable, *TRAIN[:3], "--resume", str(run), "total_steps=2400"], capture_output=True, text=True, env=ENV
    )
    assert alone.returncode == 2 and "resume it with torchrun --nproc-per-node=2" in alone.stderr, alone.stderr

    out = _torchrun("--standalone", "--nproc-per-node=2", *TRAIN[:3], "--resume", str(run), "total_steps=2400")
    assert out.returncode == 0, out.stderr[-4000:]
    a, b = load_checkpoint(run / "checkpoint.pt"), load_checkpoint(run / "rank1" / "checkpoint.pt")
    assert a["step"] == 2400
    _assert_one_learner(a, b)


def test_the_all_reduced_gradient_is_the_gradient_of_the_concatenated_batch() -> None:
    script = Path(__file__).with_name("dist_exactness.py")
    out = _torchrun("--standalone", "--nproc-per-node=2", str(script), timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    diff = float(out.stdout.strip().splitlines()[-1].split(":")[1].strip(" }"))
    assert diff < 1e-5, f"2-rank update differs from the single-process one by {diff}"


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def test_killing_one_rank_stops_the_other_with_the_reason(tmp_path: Path) -> None:
    args = [*TORCHRUN, "--standalone", "--nproc-per-node=2", *TRAIN, "total_steps=10000000"]
    args += [f"log.root={tmp_path}", "log.name=run"]
    job = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "run" / "rank1" / "meta.json").exists():
            assert job.poll() is None and time.monotonic() < deadline, "the job did not start"
            time.sleep(0.2)
        time.sleep(2.0)  # training, in the collectives
        ranks = {}
        for pid in _children(job.pid):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            rank = next((e.split(b"=")[1] for e in environ if e.startswith(b"RANK=")), None)
            if rank is not None:
                ranks[int(rank)] = pid
        assert set(ranks) == {0, 1}, ranks
        os.kill(ranks[1], signal.SIGKILL)
        killed = time.monotonic()
        output, _ = job.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    assert took < 45, f"the surviving rank ran on for {took:.0f} s"
    assert "Signal 9 (SIGKILL)" in output, output[-3000:]
    with pytest.raises(ProcessLookupError):
        os.kill(ranks[0], 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_meet_through_a_c10d_rendezvous_on_loopback(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{_free_port()}"
    node = [*TORCHRUN, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
            "--rdzv-id=q2real-test", "--local-addr=127.0.0.1"]  # fmt: skip
    train = [*TRAIN, "total_steps=800", f"log.root={tmp_path}", "log.name=run"]
    nodes = [subprocess.Popen([*node, *train], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
             for _ in range(2)]  # fmt: skip
    outputs = [job.communicate(timeout=240)[0] for job in nodes]
    for job, output in zip(nodes, outputs, strict=True):
        assert job.returncode == 0, output[-4000:]
    run = tmp_path / "run"
    _assert_one_learner(load_checkpoint(run / "checkpoint.pt"), load_checkpoint(run / "rank1" / "checkpoint.pt"))
