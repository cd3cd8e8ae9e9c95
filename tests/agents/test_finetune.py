"""The handoff: a trained run's learner continued on one robot with shifted dynamics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from q2real.agents.callbacks import Callback
from q2real.agents.onrobot.finetune import FinetuneConfig, Finetuner
from q2real.agents.train import Trainer
from q2real.cli.main import main
from q2real.configs.errors import RunDirError
from q2real.configs.loader import ConfigError, load
from tests.conftest import FIXTURE_RUN

WEAK_ACTUATOR = "shift.actuator_gain_scale=[0.5,0.5]"


def _config(tmp_path: Path, *overrides: str) -> FinetuneConfig:
    base = [f"run={FIXTURE_RUN}", WEAK_ACTUATOR, f"log.root={tmp_path}", "log.name=ft", "log.tensorboard=false"]
    return load(FinetuneConfig, None, [*base, *overrides])


def _evals(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval_return"] for r in records if "eval_return" in r}


def test_bad_jobs_are_refused_by_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="run: expected the trained run"):
        load(FinetuneConfig, None, [])
    with pytest.raises(ConfigError, match="actor_start: expected >= warmup_steps"):
        _config(tmp_path, "warmup_steps=500", "actor_start=100")
    with pytest.raises(ValueError, match="shift.actuator_gain_scale"):
        _config(tmp_path, "shift.actuator_gain_scale=[0,0.5]")
    with pytest.raises(RunDirError, match="not a training run directory"):
        Finetuner(load(FinetuneConfig, None, [f"run={tmp_path}"]))
    assert main(["finetune", "eval_envs=2"]) == 2  # an override where RUN_DIR belongs


@pytest.mark.slow
def test_the_handoff_carries_the_run_and_the_actor_waits_for_the_critic(tmp_path: Path) -> None:
    trainer = Finetuner(
        _config(tmp_path, "total_steps=600", "warmup_steps=200", "actor_start=400", "eval_every=0", "eval_envs=2")
    )
    handed_over = trainer.agent.obs_norm.count.clone()
    actor = {k: v.clone() for k, v in trainer.agent.actor.state_dict().items()}
    critic = {k: v.clone() for k, v in trainer.agent.critic.state_dict().items()}
    states = []

    class Watch(Callback):
        def on_iteration(self, trainer: Trainer) -> None:
            if trainer.step in (399, 600):
                states.append({k: v.clone() for k, v in trainer.agent.actor.state_dict().items()})

    trainer.callbacks.append(Watch())
    trainer.run()
    before_start, after = states
    assert all(torch.equal(actor[k], before_start[k]) for k in actor), "the actor moved inside the critic's warm-up"
    assert any(not torch.equal(actor[k], after[k]) for k in actor), "the actor never moved after actor_start"
    assert any(not torch.equal(critic[k], v) for k, v in trainer.agent.critic.state_dict().items())
    assert trainer.step == 600 and trainer.agent.updates > 400  # the run's update count continued
    assert handed_over > 10_000  # the batch run's statistics, continued by the robot's transitions:
    assert torch.isclose(trainer.agent.obs_norm.count, handed_over + 600)
    meta = json.loads((trainer.path / "meta.json").read_text())
    assert meta["finetuned_from"] == str(FIXTURE_RUN.resolve())
    assert 0 in _evals(trainer.path), "the handed-over policy is evaluated before the first transition"
    # The fine-tuning run is a training run: it resumes, and exports as a bundle.
    assert main(["finetune", "--resume", str(trainer.path)]) == 0
    assert main(["export", str(trainer.path)]) == 0
    assert (trainer.path / "policy.onnx").is_file()


@pytest.mark.slow
def test_the_fine_tuned_policy_recovers_from_a_weaker_actuator(tmp_path: Path) -> None:
    """Half the actuator gain costs the nominal policy about 40 % of its return; within 8000 robot
    transitions the continued learner must win most of it back, and never fall far below the handoff."""
    trainer = Finetuner(_config(tmp_path, "total_steps=8000", "eval_every=1000"))
    trainer.run()
    evals = _evals(trainer.path)
    handoff = evals[0]
    assert min(evals.values()) > handoff - 25, evals
    assert max(evals[7000], evals[8000]) > handoff + 80, evals


def test_a_run_trained_under_a_ramp_hands_over_to_fine_tuning_without_one() -> None:
    """The shift is the robot as it is: a run's curriculum does not grow it (and a ramp past the job's
    steps, or over a shift of nothing, would be refused)."""
    import dataclasses

    from q2real.agents.config import load_run_config
    from q2real.agents.onrobot.finetune import handoff_config

    run = dataclasses.replace(load_run_config(FIXTURE_RUN), randomization_ramp_steps=40_000)
    config = handoff_config(FinetuneConfig(run=str(FIXTURE_RUN)), run)
    assert config.randomization_ramp_steps == 0
    config.validate()


@pytest.mark.slow  # two short fine-tuning jobs on the pendulum: about 20 s
def test_the_anchor_keeps_the_fine_tuned_actor_near_the_handed_over_policy(tmp_path: Path) -> None:
    """Under the weak actuator the free actor moves away from the policy it was handed; with the anchor
    the same updates leave it several times closer, and the loss says how far it is."""
    job = ("total_steps=1200", "warmup_steps=200", "actor_start=200", "eval_every=0", "eval_envs=2", "seed=3")
    probe = torch.randn(256, 3, generator=torch.Generator().manual_seed(0))
    distances = {}
    for weight in (0.0, 30.0):
        trainer = Finetuner(_config(tmp_path, *job, f"anchor={weight}", f"log.name=ft{weight}"))
        handed_over = trainer.agent.act(probe, deterministic=True, averaged=False)
        trainer.run()
        moved = trainer.agent.act(probe, deterministic=True, averaged=False) - handed_over
        distances[weight] = float(moved.abs().mean())
        records = [json.loads(line) for line in (trainer.path / "metrics.jsonl").read_text().splitlines()]
        logged = [r["anchor_distance"] for r in records if "anchor_distance" in r]
        assert bool(logged) == (weight > 0), "the anchor's distance is logged where there is an anchor"
    assert distances[0.0] > 0.02, distances
    assert distances[30.0] < 0.35 * distances[0.0], distances


def test_an_anchor_is_refused_unless_a_finite_weight_of_zero_or_more(tmp_path: Path) -> None:
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(ConfigError, match="anchor: expected a finite weight >= 0"):
            _config(tmp_path, f"anchor={bad}")
