"""Parallel Q-Learning: ratios held, weights flowing both ways while training, clean shutdown on a
learner error and on Ctrl-C, resume from a PQL checkpoint."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from q2real.agents.callbacks import Callback
from q2real.agents.common.checkpoint import CHECKPOINT, load_checkpoint
from q2real.agents.common.guard import NonFiniteError
from q2real.agents.config import TrainConfig
from q2real.agents.pql import POLICY, LearnerError
from q2real.agents.train import Trainer, resume, train
from q2real.configs.loader import load

pytestmark = pytest.mark.slow  # learner processes


def _config(tmp_path: Path, *extra: str, algo: str = "sac") -> TrainConfig:
    overrides = ["pql.enabled=true", "total_steps=4000", "warmup_steps=600", "eval_every=0", "eval_envs=2"]
    overrides += ["checkpoint_every=0", "log.interval_steps=500", f"log.root={tmp_path}", "log.tensorboard=false"]
    overrides += [f"algo={algo}", f"{algo}.actor_hidden=[64,64]", f"{algo}.critic_hidden=[64,64]"]
    overrides += [f"{algo}.batch_size=128", *extra]
    return load(TrainConfig, None, overrides)


def _no_learner_processes() -> bool:
    return not [p for p in multiprocessing.active_children() if p.name.startswith("q2real-pql")]


class Probe(Callback):
    """Records the collector's deterministic action on fixed observations every iteration."""

    def on_start(self, trainer: Trainer) -> None:
        self.obs = torch.randn(8, trainer.env.obs_dim, generator=torch.Generator().manual_seed(0))
        self.actions: list[torch.Tensor] = []
        self.critic = [p.detach().clone() for p in trainer.agent.critic.parameters()]
        self.counts: list[tuple[int, int, int]] = []

    def on_iteration(self, trainer: Trainer) -> None:
        self.actions.append(trainer.agent.act(self.obs, deterministic=True).clone())
        counters = trainer.parallel.counters
        self.counts.append((trainer.iteration, int(counters[1]), int(counters[POLICY])))


@pytest.mark.timeout(300)
def test_ratios_hold_and_weights_flow_between_collector_and_learners(tmp_path: Path) -> None:
    probe = Probe()
    config = _config(tmp_path, "pql.critic_updates_per_step=0.5", "pql.critic_updates_per_policy_update=1.5")
    threads = torch.get_num_threads()
    trainer = Trainer(config, callbacks=[probe])
    trainer.run()
    assert _no_learner_processes()
    assert torch.get_num_threads() == threads, "the run left its torch thread setting behind"
    warm = -(-config.warmup_steps // config.env.num_envs)
    iterations, critic, policy = probe.counts[-1]
    assert critic / (iterations - warm) == pytest.approx(0.5, rel=0.2)
    assert critic / policy == pytest.approx(1.5, rel=0.2)
    logged = [json.loads(line) for line in (trainer.path / "metrics.jsonl").read_text().splitlines()]
    measured = [m["pql/critic_updates_per_step"] for m in logged if "pql/critic_updates_per_step" in m]
    # Each logged window may be off by up to `slack` updates; over the run they average to the target.
    assert len(measured) >= 4 and sum(measured[1:]) / len(measured[1:]) == pytest.approx(0.5, rel=0.2), measured
    # The policy the collector acts with changed many times while training ran, not only at the end ...
    changes = sum(not torch.equal(a, b) for a, b in zip(probe.actions, probe.actions[1:], strict=False))
    assert changes > 50, f"collector's policy changed only {changes} times"
    # ... and the collector's agent holds the critic the V-learner trained.
    assert any(not torch.equal(a, b) for a, b in zip(probe.critic, trainer.agent.critic.parameters(), strict=True))


@pytest.mark.timeout(300)
def test_a_learner_error_stops_everything_and_leaves_no_processes(tmp_path: Path) -> None:
    config = _config(tmp_path, "sac.critic_lr=1e30", "total_steps=40000")
    # The critic learner meets the non-finite loss first, or the collector meets the actions of a policy
    # trained on it: either way training stops with the reason and every process is gone.
    with pytest.raises((LearnerError, NonFiniteError), match="non-finite") as caught:
        train(config)
    if isinstance(caught.value, LearnerError):
        assert "critic learner failed" in str(caught.value) or "policy learner failed" in str(caught.value)
    assert _no_learner_processes()


class Interrupt(Callback):
    def on_iteration(self, trainer: Trainer) -> None:
        if trainer.agent.updates > 100:
            raise KeyboardInterrupt


@pytest.mark.timeout(300)
def test_ctrl_c_writes_a_final_checkpoint_and_resume_continues(tmp_path: Path) -> None:
    config = _config(tmp_path, "log.name=run")
    trainer = Trainer(config, callbacks=[Interrupt()])
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    assert _no_learner_processes()
    state = load_checkpoint(tmp_path / "run" / CHECKPOINT)
    assert state["updates"] > 100 and state["step"] == trainer.step
    assert state["optimizers"]["critic"]["state"], "the V-learner's optimizer state was not handed over"
    resumed = resume(tmp_path / "run", config)
    assert resumed.step >= config.total_steps and resumed.agent.updates > state["updates"]
    assert _no_learner_processes()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["td3", "flashsac", "sac+chunks"])
def test_every_learner_runs_under_pql(tmp_path: Path, case: str) -> None:
    algo = case.split("+")[0]
    extra = ["total_steps=2000", f"{algo}.batch_size=64", f"{algo}.actor_hidden=[32]", f"{algo}.critic_hidden=[32]"]
    if case.endswith("chunks"):  # the learner processes sample chunk windows
        extra += ["sac.chunk.size=3"]
    trainer = train(_config(tmp_path, *extra, algo=algo))
    learned = trainer.iteration - -(-trainer.config.warmup_steps // trainer.env.num_envs)
    assert trainer.agent.updates == pytest.approx(learned, rel=0.2)
    assert _no_learner_processes()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


@pytest.mark.timeout(300)
def test_learners_exit_when_the_training_process_is_killed(tmp_path: Path) -> None:
    code = (
        "from q2real.agents.config import TrainConfig\nfrom q2real.agents.train import train\n"
        "from q2real.configs.loader import load\n"
        f"train(load(TrainConfig, None, ['pql.enabled=true', 'total_steps=10000000', 'eval_every=0',"
        f" 'checkpoint_every=0', 'log.root={tmp_path}', 'log.tensorboard=false']))\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        learners: list[int] = []
        while len(learners) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
            learners = [pid for pid in _children(process.pid) if "spawn_main" in _cmdline(pid)]
        assert len(learners) == 2, "the learner processes did not start"
        process.kill()
        process.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in learners) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in learners), "learners outlived the killed training process"
    finally:
        process.kill()


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (Path("/proc") / str(pid) / "cmdline").read_text().replace("\0", " ")
    return ""
