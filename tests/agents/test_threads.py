"""torch's CPU thread count is tuned while training: all cores on a quiet machine, one beside a busy
neighbour. The timing is faked here (a clock that charges each iteration by the thread count in use),
because a real neighbour's effect cannot be produced reliably in a test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import q2real.agents.common.threads as threads_module
from q2real.agents.common.threads import ThreadTuner


class FakeClock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, seconds_per_iteration: dict[int, float]):
        self.now, self.cost = 0.0, seconds_per_iteration
        monkeypatch.setattr(threads_module.time, "perf_counter", lambda: self.now)

    def iterate(self, tuner: ThreadTuner, iterations: int) -> None:
        for _ in range(iterations):
            self.now += self.cost[torch.get_num_threads()]
            tuner.step()


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_quiet_machine_keeps_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(monkeypatch, {2: 0.008, 1: 0.0105})
    tuner = ThreadTuner(2)
    clock.iterate(tuner, 3000)
    assert tuner.summary()["chosen"] == 2 and tuner.iterations[1] < 0.05 * 3000


def test_a_busy_neighbour_moves_the_loop_to_one_thread_and_its_end_moves_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(monkeypatch, {2: 0.008, 1: 0.0105})
    tuner = ThreadTuner(2)
    clock.iterate(tuner, 500)
    clock.cost = {2: 0.040, 1: 0.0105}  # a neighbour starts: two threads now wait on a descheduled worker
    clock.iterate(tuner, 100)
    assert tuner.current == 1, "a sudden slowdown is re-checked at once"
    before = tuner.iterations.copy()
    clock.iterate(tuner, 2000)
    assert tuner.iterations[2] - before[2] < 0.03 * 2000, "probing the slow count is rare"
    clock.cost = {2: 0.008, 1: 0.0105}  # the neighbour ends
    clock.iterate(tuner, 6000)
    assert tuner.current == 2


def test_mlp_updates_are_bit_identical_on_one_and_two_threads() -> None:
    """Why SAC and TD3 runs stay reproducible while the tuner switches (FlashSAC's batch norms are not:
    bit-exact runs of it need a fixed `threads=N`)."""
    from q2real.agents.algos.sac import SAC, SACConfig
    from q2real.agents.common.actor_critic import Sizes
    from q2real.agents.common.replay import Batch

    def train(count: int) -> torch.Tensor:
        torch.set_num_threads(count)
        torch.manual_seed(0)
        agent = SAC(SACConfig(batch_size=256), Sizes(3, 1, 1, torch.device("cpu")))
        gen = torch.Generator().manual_seed(0)
        for _ in range(3):
            obs, next_obs = torch.randn(256, 3, generator=gen), torch.randn(256, 3, generator=gen)
            action, reward = torch.rand(256, 1, generator=gen) * 2 - 1, torch.randn(256, generator=gen)
            discount, index = torch.full((256,), 0.99), torch.arange(256)
            agent.update(Batch(obs, action, reward, next_obs, discount, index, torch.zeros_like(index), reward * 0))
        return torch.cat([p.detach().flatten() for p in agent.parameters()])

    assert torch.equal(train(1), train(2))


@pytest.mark.slow  # a training run in a subprocess: 3.7 s quiet, 4.9 s on a slow day
def test_the_run_records_its_thread_policy(tmp_path: Path) -> None:
    from q2real.agents.config import TrainConfig
    from q2real.agents.train import train
    from q2real.configs.loader import load

    overrides = ["total_steps=400", "warmup_steps=200", "eval_every=0", "eval_envs=2", "checkpoint_every=0"]
    overrides += ["sac.actor_hidden=[16]", "sac.critic_hidden=[16]", "sac.batch_size=32", f"log.root={tmp_path}"]
    run = train(load(TrainConfig, None, [*overrides, "log.name=auto", "log.tensorboard=false"]))
    meta = json.loads((run.path / "meta.json").read_text())["threads"]
    if torch.get_num_threads() >= 2:
        assert meta["policy"] == "auto" and meta["chosen"] in meta["candidates"]
    fixed = train(load(TrainConfig, None, [*overrides, "log.name=fixed", "log.tensorboard=false", "threads=1"]))
    assert json.loads((fixed.path / "meta.json").read_text())["threads"] == {"policy": "fixed", "chosen": 1}
