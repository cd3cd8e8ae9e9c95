"""The training loop: determinism, checkpoints, resume after a crash or kill -9, the non-finite guard."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from q2real.agents.callbacks import Callback
from q2real.agents.common.checkpoint import load_checkpoint
from q2real.agents.common.guard import NonFiniteError
from q2real.agents.common.metrics import read_metrics
from q2real.agents.config import TrainConfig, load_run_config
from q2real.agents.learners import widened
from q2real.agents.train import Trainer, resume, train
from q2real.configs.loader import ConfigError, load, to_dict
from q2real.residual.train import ResidualTrainConfig


def small(tmp_path: Path, name: str, algo: str = "sac", extra: tuple[str, ...] = ()) -> TrainConfig:
    overrides = [
        f"algo={algo}",
        "env.num_envs=2",
        "env.task_params.episode_length=50",
        "total_steps=600",
        "warmup_steps=100",
        "eval_every=0",
        "eval_envs=2",
        "checkpoint_every=200",
        f"{algo}.actor_hidden=[32,32]",
        f"{algo}.critic_hidden=[32,32]",
        f"{algo}.batch_size=32",
        f"log.root={tmp_path}",
        f"log.name={name}",
        "log.tensorboard=false",
        "log.interval_steps=200",
        "threads=1",  # bit-exact runs need a fixed thread count (FlashSAC's batch statistics reduce by thread)
        *extra,
    ]
    return load(TrainConfig, None, overrides)


def params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.agent.state_dict().items()}


class Crash(Callback):
    def __init__(self, at_step: int):
        self.at_step = at_step

    def on_iteration(self, trainer: Trainer) -> None:
        if trainer.step >= self.at_step:
            raise RuntimeError("simulated crash")


CHUNKED = ("sac.chunk.size=3", "env.task_params.episode_length=60")
"""A chunk learner: its queues of actions still to execute are part of what a resume restores (the
checkpoint at step 400 falls mid-episode and mid-chunk)."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algo", "extra"),
    [("sac", ()), ("td3", ()), ("flashsac", ()), ("sac", CHUNKED), ("crossq", ("crossq.compile=true",))],
    ids=["sac", "td3", "flashsac", "chunks", "crossq-compiled"],
)
def test_same_seed_same_result_and_resume_after_crash_is_exact(tmp_path: Path, algo: str, extra) -> None:
    straight = train(small(tmp_path, "a", algo, extra))
    again = train(small(tmp_path, "b", algo, extra))
    reference = params(straight)
    assert all(torch.equal(reference[k], v) for k, v in params(again).items())

    crashed = Trainer(small(tmp_path, "c", algo, extra), callbacks=[Crash(at_step=500)])
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.run()
    assert load_checkpoint(tmp_path / "c" / "checkpoint.pt")["step"] == 400
    resumed = resume(tmp_path / "c", small(tmp_path, "c", algo, extra))
    assert resumed.step == 600
    assert all(torch.equal(reference[k], v) for k, v in params(resumed).items())
    metrics = (tmp_path / "c" / "metrics.jsonl").read_text()
    assert '"step": 600' in metrics
    assert "resumes" in (tmp_path / "c" / "meta.json").read_text()


def test_checkpoint_holds_only_plain_tensors_and_containers(tmp_path: Path) -> None:
    trainer = train(small(tmp_path, "w", "td3"))
    state = load_checkpoint(trainer.last_checkpoint)  # torch.load(weights_only=True) after the hash check
    assert {"agent", "optimizers", "replay", "env", "rng", "config", "step"} <= set(state)
    assert state["config"]["algo"] == "td3" and state["step"] == 600
    # Right-sized: the 300 rows per env in use of the default 1M-transition replay, not all of it.
    replay = state["replay"]
    assert replay["size"] == 300 and replay["rows"] == 500_000
    assert all(len(tensor) == 300 for tensor in replay["data"].values())
    assert trainer.last_checkpoint.stat().st_size < 2_000_000


class Poison(Callback):
    def on_iteration(self, trainer: Trainer) -> None:
        if trainer.step >= 450:
            with torch.no_grad():
                next(trainer.agent.critic.parameters()).fill_(float("nan"))


@pytest.mark.slow  # two training runs: 2.8 s quiet, 4.3 s on a slow day
def test_non_finite_loss_stops_training_naming_it_and_the_last_checkpoint(tmp_path: Path) -> None:
    trainer = Trainer(small(tmp_path, "nan"), callbacks=[Poison()])
    with pytest.raises(NonFiniteError, match=r"critic_loss became non-finite at env step \d+.*last good checkpoint: "):
        trainer.run()
    state = load_checkpoint(tmp_path / "nan" / "checkpoint.pt")
    assert state["step"] == 400
    assert all(torch.isfinite(v).all() for v in state["agent"].values() if v.is_floating_point())


@pytest.mark.slow
def test_kill_minus_nine_leaves_a_loadable_checkpoint_and_resume_finishes(tmp_path: Path) -> None:
    config = small(tmp_path, "k", "sac", ("total_steps=200000", "checkpoint_every=100", "log.interval_steps=100"))
    preset = tmp_path / "k.yaml"
    preset.write_text(yaml.safe_dump(to_dict(config)))
    code = "import sys; from q2real.cli.main import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "train", "--preset", str(preset)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint = tmp_path / "k" / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not checkpoint.exists():
        time.sleep(0.2)
    assert checkpoint.exists(), "training never wrote a checkpoint"
    time.sleep(1.5)  # a few more checkpoints, so the kill may land mid-write
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    step = load_checkpoint(checkpoint)["step"]
    assert step >= 100
    finished = resume(tmp_path / "k", small(tmp_path, "k", "sac", (f"total_steps={step + 200}",)))
    assert finished.step == step + 200


@pytest.mark.slow  # trains two short runs
def test_a_run_started_from_another_begins_with_its_learner_and_acts_with_it_during_warmup(tmp_path: Path) -> None:
    first = train(small(tmp_path, "first", "crossq", ("crossq.renorm_warmup=50",))).path
    learned = load_checkpoint(first / "checkpoint.pt")["agent"]
    start = [f"init_from={first}", "total_steps=200", "warmup_steps=100", "crossq.renorm_warmup=50"]
    trainer = Trainer(small(tmp_path, "second", "crossq", tuple(start)))
    for name, tensor in trainer.agent.state_dict().items():
        assert torch.equal(tensor, learned[name]), f"{name} did not come from {first}"
    trainer.obs = trainer.env.reset(seed=5)
    torch.manual_seed(1)
    warmup = trainer.warmup_action()
    torch.manual_seed(1)
    assert torch.equal(warmup, trainer.agent.act(trainer.env.reset(seed=5))), "warm-up must act with the loaded policy"
    trainer.run()
    assert trainer.agent.updates > 0 and trainer.step == 200
    assert load_checkpoint(trainer.path / "checkpoint.pt")["step"] == 200, "a fresh run counts from zero"
    shutil.rmtree(first)  # a resume reads its own checkpoint, not the run it began from
    resumed = Trainer(small(tmp_path, "second", "crossq", (*start, "total_steps=400")), resume=trainer.path)
    assert resumed.step == 200
    resumed.env.close()
    resumed.eval_env.close()


@pytest.mark.slow  # trains a tiny CrossQ run to start from
def test_a_run_with_more_observed_terms_starts_from_one_without_them_acting_as_it_did(tmp_path: Path) -> None:
    """A policy trained on the nominal robot seeds one that also sees its earlier actions (a curriculum
    step toward latency) and whose critics see the robot's draw: the new input columns start with zero
    weights, so the new networks compute what the old ones did whatever those columns hold; the critics
    too, the action after the new terms."""
    extra = ("crossq.renorm_warmup=50", "env.task_params.observe_last_action=true")
    first = train(small(tmp_path, "first", "crossq", extra)).path
    from q2real.agents.learners import restore_agent

    old_trainer = Trainer(small(tmp_path, "probe", "crossq", extra))
    old, _ = restore_agent(first, load_run_config(first), old_trainer.env)
    more = ("env.task_params.action_history=2", "env.task_params.critic_dynamics=true")
    latency = "env.randomization.action_latency=[0,2]"
    grown = Trainer(small(tmp_path, "grown", "crossq", (*extra, f"init_from={first}", *more, latency)))
    new = grown.agent.eval()
    assert grown.env.obs_names[-2:] == ("last_action", "action_history") and grown.env.critic_names == ("dynamics",)
    obs = old_trainer.env.reset(seed=3)
    history = torch.rand(obs.shape[0], 2 * grown.env.action_dim) * 2 - 1
    full = torch.cat([obs, history, torch.randn(obs.shape[0], 6)], -1)  # and the critic-only robot draw
    with torch.no_grad():
        torch.testing.assert_close(new.act(full, True), old.act(obs, True))
        action = torch.rand(obs.shape[0], grown.env.action_dim) * 2 - 1
        torch.testing.assert_close(new.q_values(full, action), old.q_values(obs, action))
    for trainer in (old_trainer, grown):
        trainer.env.close()
        trainer.eval_env.close()
    with pytest.raises(
        ConfigError, match=r"observed policy terms \[.*'last_action'\]; .*only policy terms appended after"
    ):
        Trainer(small(tmp_path, "fewer", "crossq", ("crossq.renorm_warmup=50", f"init_from={first}")))


def test_widening_puts_new_policy_and_critic_columns_each_after_their_old_ones() -> None:
    """A source observing policy columns p0 p1 and critic-only c0, a learner that adds policy p2 and
    critic-only c1 c2: the actor's input grows by p2 alone; the critic's ([obs | action]) and the
    normalizer's by all three, each new column where the learner expects it and zero or fresh there."""
    stored = {
        "actor.0.weight": torch.tensor([[1.0, 2.0]]),  # policy columns only
        "critic.0.weight": torch.tensor([[1.0, 2.0, 3.0, 9.0]]),  # p0 p1 c0 | a
        "obs_norm.mean": torch.tensor([1.0, 2.0, 3.0]),
    }
    mine = {
        "actor.0.weight": torch.full((1, 3), 7.0),
        "critic.0.weight": torch.full((1, 7), 7.0),
        "obs_norm.mean": torch.full((6,), 5.0),
    }
    out = widened(stored, mine, [(2, 1), (3, 2)])
    assert out["actor.0.weight"].tolist() == [[1.0, 2.0, 0.0]]
    assert out["critic.0.weight"].tolist() == [[1.0, 2.0, 0.0, 3.0, 0.0, 0.0, 9.0]]
    assert out["obs_norm.mean"].tolist() == [1.0, 2.0, 5.0, 3.0, 5.0, 5.0]


def test_starting_from_a_run_that_does_not_fit_names_what_differs(tmp_path: Path) -> None:
    first = train(small(tmp_path, "first", "sac", ("total_steps=200",))).path
    with pytest.raises(Exception, match=r"sac\.critic_hidden"):
        Trainer(small(tmp_path, "wider", "sac", (f"init_from={first}", "sac.critic_hidden=[64,64]")))
    with pytest.raises(Exception, match=r"init_from: .*nowhere holds no checkpoint\.pt"):
        Trainer(small(tmp_path, "lost", "sac", (f"init_from={tmp_path / 'nowhere'}",)))
    with pytest.raises(Exception, match=r"init_from: a residual run starts from its base policy"):
        load(ResidualTrainConfig, None, [f"init_from={first}"])


class Strengths(Callback):
    """The training and evaluation envs' randomization strength after each iteration."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float, float]] = []

    def on_iteration(self, trainer: Trainer) -> None:
        self.seen.append((trainer.step, trainer.env.randomization_strength, trainer.eval_env.randomization_strength))


RAMPED = ("env.randomization.mass_scale=[0.5,1.5]", "env.randomization.action_latency=[0,2]")


def test_a_randomization_ramp_grows_the_training_envs_and_resumes_where_it_was(tmp_path: Path) -> None:
    """The strength of the iteration that collected step s is s's level of 100; evaluation runs the full
    ranges throughout; the log and console carry it; a resume re-installs the level of its step."""
    seen = Strengths()
    config = small(tmp_path, "ramp", extra=(*RAMPED, "randomization_ramp_steps=400"))
    trainer = train(config, [seen])
    collected_at = [0] + [step for step, _, _ in seen.seen[:-1]]
    assert [s for _, s, _ in seen.seen] == [min(100, c * 100 // 400) / 100 for c in collected_at]
    assert seen.seen[-1][1] == 1.0 and 0.0 < seen.seen[len(seen.seen) // 2][1] < 1.0
    assert all(full == 1.0 for _, _, full in seen.seen)
    rows = read_metrics(trainer.path / "metrics.jsonl")
    logged = [row["randomization_strength"] for row in rows if "randomization_strength" in row]
    assert logged == [0.49, 0.99, 1.0]  # at steps 200, 400, 600: the last iteration's collect sets each
    mid = Trainer(small(tmp_path, "ramp", extra=(*RAMPED, "randomization_ramp_steps=400")), resume=trainer.path)
    try:
        mid.step = 200  # as a checkpoint of step 200 would restore it
        mid.collect()
        assert mid.env.randomization_strength == 0.5
    finally:
        mid.env.close()
        mid.eval_env.close()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("randomization_ramp_steps=400",), "randomization_ramp_steps: grows env.randomization, and env.task"),
        ((*RAMPED, "randomization_ramp_steps=900"), "randomization_ramp_steps: expected <= total_steps"),
        ((*RAMPED, "randomization_ramp_steps=-1"), "randomization_ramp_steps: expected >= 0"),
    ],
)
def test_a_randomization_ramp_that_cannot_grow_anything_is_refused(tmp_path: Path, extra, message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        Trainer(small(tmp_path, "bad", extra=extra))
