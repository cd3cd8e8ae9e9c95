"""The training loop never reads a value back from the device per update.

On a GPU every `.item()`, `float(t)`, `bool(t)` or `.tolist()` waits for the queue to drain; q2real
keeps its metrics, guards and sampler statistics on the device and reads them once per logging
window. These tests run collection (the env on its GPU auto-reset path) and updates with those four
patched to count calls.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from q2real.agents.config import TrainConfig
from q2real.agents.train import Trainer
from q2real.configs.loader import load

READS = ("item", "__float__", "__bool__", "tolist")


@contextlib.contextmanager
def counting_reads():
    """Count host reads of tensors, by the file and line that asked for them."""
    calls: Counter[str] = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(name):
        def read(self, *args, **kwargs):
            caller = sys._getframe(1)
            calls[f"{name} from {caller.f_code.co_filename}:{caller.f_lineno}"] += 1
            return originals[name](self, *args, **kwargs)

        return read

    for name in READS:
        setattr(torch.Tensor, name, counted(name))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def trainer(tmp_path: Path, algo: str, sampler: str, extra: tuple[str, ...] = ()) -> Trainer:
    overrides = [
        *extra,
        f"algo={algo}",
        f"{algo}.actor_hidden=[16]",
        f"{algo}.critic_hidden=[16]",
        f"{algo}.batch_size=32",
        f"sampler.kind={sampler}",
        "env.num_envs=2",
        "env.backend=mujoco",
        "warmup_steps=64",
        "eval_every=0",
        "checkpoint_every=0",
        "log.interval_steps=1000000",
        "log.tensorboard=false",
        f"log.root={tmp_path}",
    ]
    if sampler == "dspear":
        overrides.append(f"{algo}.critic_head=scalar")
    return Trainer(load(TrainConfig, None, overrides))


CASES = {
    # The robot's clamps in the loop (on Panda, where every rule has joints to act on).
    "shield": ("env.shield_in_loop=true", "env.task=panda_reach"),
    # Chunk queues in collection; chunk windows with every prefix's backup in the updates.
    "chunks": ("sac.chunk.size=3", "sac.chunk.critic=multi", "sac.chunk.execute=2", "sac.chunk.ensemble=0.1"),
    "dqc": ("td3.chunk.size=3", "td3.chunk.critic=dqc", "td3.chunk.policy_size=2"),
    # The averaged actor's step after each actor step.
    "averaged": ("sac.actor_average=0.01",),
}


@pytest.mark.parametrize(
    ("algo", "sampler"),
    [
        ("sac", "uniform"),
        ("td3", "uniform"),
        ("flashsac", "uniform"),
        ("sac", "prioritized"),
        ("td3", "dspear"),
        ("sac", "shield"),
        ("sac", "chunks"),
        ("sac", "averaged"),
        ("td3", "prioritized+dqc"),
    ],
)
def test_collection_and_updates_never_read_a_tensor_back(tmp_path: Path, algo: str, sampler: str) -> None:
    sampler, _, variant = sampler.partition("+")
    extra = CASES.get(variant or sampler, ())
    run = trainer(tmp_path, algo, "uniform" if sampler in CASES else sampler, extra)
    run.env.reset_every_step = True  # the GPU's auto-reset path, on this CPU
    try:
        for _ in range(40):  # past the warm-up, so updates run
            run.collect()
            run.learn()
        updates = run.agent.updates
        with counting_reads() as calls:
            for _ in range(20):
                run.collect()
                run.learn()
        assert run.agent.updates >= updates + 20
        assert not calls, f"host reads per update: {dict(calls)}"
        # The window's one read-back still sees everything.
        metrics = run.pop_update_metrics()
        assert "critic_loss" in metrics and "actor_loss" in metrics
        if sampler not in ("uniform", *CASES):
            assert 0 < metrics["replay/prioritized_fraction"] <= 1 and metrics["replay/beta"] > 0
    finally:
        run.env.close()
        run.eval_env.close()
        run.logger.close()


def test_the_counter_sees_a_read(tmp_path: Path) -> None:
    with counting_reads() as calls:
        float(torch.ones(()))
        torch.zeros(2).tolist()
    assert sum(calls.values()) == 2
