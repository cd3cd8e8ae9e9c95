"""Shipped presets: one per robot task, loadable, and the settings the benchmarks and fixtures train with."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from q2real.agents.config import TrainConfig
from q2real.configs.loader import list_presets, load, to_dict
from q2real.gate.perturbations import perturbations
from q2real.hardware import robot_spec
from q2real.hardware.model import load_model

ROBOT_TASKS = ["panda_reach", "panda_push", "spot_joystick", "gr1_stand", "pendulum_swingup"]
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pendulum_run" / "config.yaml"


@pytest.mark.parametrize("task", ROBOT_TASKS)
def test_every_robot_task_has_a_preset_that_loads(task: str) -> None:
    assert f"sac_{task}" in list_presets()
    config = load(TrainConfig, f"sac_{task}")
    assert config.env.task == task and config.algo == "sac"
    assert config.env.shield_in_loop is not False, "robot tasks train with the shield's clamps in the loop"


@pytest.mark.parametrize("preset", ["sac_panda_reach", "sac_panda_push", "crossq_panda_push"])
def test_the_arm_presets_train_on_every_row_the_gate_sizes_for_the_arm(preset: str) -> None:
    """The positive control is only meaningful if the run trained for what the gate asks of it."""
    config = load(TrainConfig, preset)
    spec = robot_spec("panda")
    rows = perturbations(config.env.randomization, spec, load_model(spec))
    assert {r.name for r in rows} >= {"payload", "pd_gains", "latency", "pushes"}
    assert [r.name for r in rows if r.required and not r.in_range] == []


def test_the_pendulum_preset_is_how_the_committed_run_was_trained() -> None:
    trained = yaml.safe_load(FIXTURE.read_text())
    preset = to_dict(load(TrainConfig, "sac_pendulum_swingup"))
    for config in (trained, preset):
        config.pop("log")
        # The run predates these keys; their defaults then were off and none.
        config["env"].pop("shield_in_loop", None)
        config["env"].pop("shield_penalty", None)
        config["env"]["randomization"].pop("payload", None)
        config["sac"].pop("chunk", None)  # per-step learners before chunks existed: chunk.size 1
        config["sac"].pop("target_subset", None)  # before critic subsets: 0, the minimum over all critics
        config["sac"].pop("num_quantiles", None)  # before quantile heads (unused by a scalar head)
        config["sac"].pop("drop_top", None)
        config["sac"].pop("adam_beta1", None)  # before CrossQ: Adam's default 0.9
        config["sac"].pop("target_network", None)  # and every learner kept a target critic
        config["sac"].pop("critic_network", None)  # and critics shared the actor's trunk, without dropout
        config["sac"].pop("critic_dropout", None)
        config["sac"].pop("matmul_dtype", None)  # and every product ran in float32
        config["sac"].pop("actor_average", None)  # and the policy was the trained actor itself
        config["sac"].pop("compile", None)  # and every step ran eagerly
        config.pop("init_from", None)  # and every run started from scratch
        config.pop("randomization_ramp_steps", None)  # and the ranges were full from the first step
    assert preset == trained


def test_the_panda_reach_preset_is_how_the_committed_bench_run_was_trained() -> None:
    """The gate's positive-control test judges the committed run: it must be the preset's, not an older one."""
    committed = Path(__file__).resolve().parents[1] / "fixtures" / "panda_reach_run" / "config.yaml"
    trained = yaml.safe_load(committed.read_text())
    preset = to_dict(load(TrainConfig, "sac_panda_reach"))
    for config in (trained, preset):
        config.pop("log")
        config["sac"].pop("chunk", None)  # trained before chunks existed, as a per-step learner (chunk.size 1)
        config["sac"].pop("target_subset", None)  # and before critic subsets (0: the minimum over all)
        config["sac"].pop("num_quantiles", None)  # and before quantile heads (unused by a scalar head)
        config["sac"].pop("drop_top", None)
        config["sac"].pop("adam_beta1", None)
        config["sac"].pop("target_network", None)
        config["sac"].pop("critic_network", None)
        config["sac"].pop("critic_dropout", None)
        config["sac"].pop("matmul_dtype", None)
        config["sac"].pop("actor_average", None)
        config["sac"].pop("compile", None)
        config.pop("init_from", None)
        config.pop("randomization_ramp_steps", None)  # and the ranges were full from the first step
    assert preset == trained
    assert to_dict(load(TrainConfig, "sac_panda_reach"))["sac"]["chunk"]["size"] == 1


@pytest.mark.parametrize("task", ["spot_joystick", "gr1_stand", "gr1_joystick"])
def test_the_locomotion_skill_presets_train_crossq_on_what_the_robot_gives(task: str) -> None:
    """`bench/skills.py` trains these: CrossQ, the previous action observed (the node's `last_action`
    term), the shield's clamps in the loop, and the 20 s episodes the skill is judged on."""
    config = load(TrainConfig, f"crossq_{task}")
    assert config.env.task == task and config.algo == "crossq"
    assert config.env.task_params["observe_last_action"] is True
    assert config.env.shield_in_loop is not False
    assert config.agent.target_network is False and config.agent.network == "renorm"
    if task == "gr1_stand":
        assert config.env.task_params["episode_length"] == 1000
    if task.startswith("gr1"):
        assert config.env.randomization.push_force[1] > 0, "GR1 learns to stand and walk through pushes"
