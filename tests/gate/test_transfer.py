"""The sim-to-sim transfer gate: its rows, its shielded evaluation, and the whole gate on the default task."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from q2real.agents.callbacks import evaluate
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.gate.perturbations import perturbations
from q2real.gate.shielded import shielded_returns
from q2real.gate.transfer import run_gate
from q2real.gate.verdict import GateError, ratio_interval, wilson_interval
from q2real.hardware import robot_spec
from q2real.hardware.model import load_model
from q2real.sim import RandomizationConfig, make


def _rows(trained: RandomizationConfig, robot: str = "panda") -> dict:
    spec = robot_spec(robot)
    return {p.name: p for p in perturbations(trained, spec, load_model(spec))}


def test_rows_are_sized_for_the_robot_and_marked_by_what_the_run_trained() -> None:
    trained = RandomizationConfig(mass_scale=(0.7, 1.3), action_latency=(0, 3), payload=(0.0, 2.0))
    rows = _rows(trained)
    assert rows["nominal"].in_range and rows["nominal"].randomization == RandomizationConfig()
    # Pushes change the free 18.5 kg arm's speed by 0.3 m/s in one 20 ms tick; the payload is the spec's.
    assert rows["pushes"].randomization.push_force == (0.0, 277.5) and "277.5 N" in rows["pushes"].magnitude
    assert rows["pushes"].randomization.push_interval == (25, 75)
    assert rows["payload"].randomization.payload == (0.0, 3.0) and not rows["payload"].in_range  # trained 2 kg
    assert rows["mass"].in_range and rows["mass"].randomization.mass_scale == (0.8, 1.2)
    assert rows["latency"].in_range and rows["latency"].randomization.action_latency == (1, 3)
    assert rows["pd_gains"].randomization.kp_scale == (0.7, 1.0) and not rows["pd_gains"].in_range
    together = rows["all together"]
    assert together.required and not together.in_range and together.randomization.payload == (0.0, 3.0)
    stress = rows["all beyond"]
    assert not stress.required and stress.randomization.mass_scale == pytest.approx((0.4, 1.6))
    assert stress.randomization.action_latency == (4, 4) and stress.randomization.payload == (0.0, 6.0)
    # A torque robot has no PD gains in its actuators, an arm without a rated payload no payload row.
    assert "pd_gains" not in _rows(RandomizationConfig(), "pendulum")
    assert "payload" not in _rows(RandomizationConfig(), "spot")


def test_the_shield_is_transparent_to_an_in_limit_policy(pendulum_run: Path) -> None:
    """Torque actions in [-1, 1] pass the shield unchanged, so shielded returns equal plain evaluation."""
    bundle = PolicyBundle(pendulum_run / "policy.onnx")
    env = make(task="pendulum_swingup", num_envs=4, backend="mujoco", device="cpu")
    shielded = shielded_returns(bundle, env, seed=3)

    def policy(obs: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(bundle.normalized(bundle(obs.numpy())))

    plain = evaluate(policy, env, seed=3)
    assert torch.allclose(shielded.returns, plain, rtol=1e-5), (shielded.returns, plain)
    assert shielded.interventions == 0 and shielded.change == 0 and shielded.rules == {}


def test_the_gate_executes_a_chunk_bundle_as_evaluation_does(tmp_path: Path) -> None:
    """Each env's chunks go through the node's queue and every tick through its own shield: for an
    in-limit torque policy the shielded returns equal those of the same bundle evaluated directly."""
    from q2real.agents.callbacks import ChunkExecutor
    from q2real.agents.common.chunk_critics import ChunkConfig
    from tests.deploy_ros.conftest import export_fresh_agent

    chunk = ChunkConfig(size=3, critic="multi", execute=2, ensemble=0.2, width=8, heads=2)
    bundle = PolicyBundle(export_fresh_agent("pendulum_swingup", tmp_path / "chunks.onnx", chunk=chunk))
    env = make(task="pendulum_swingup", num_envs=4, backend="mujoco", device="cpu")
    shielded = shielded_returns(bundle, env, seed=3)

    def predict(obs: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(bundle.normalized(bundle(obs.numpy())))

    plain = evaluate(ChunkExecutor(predict, bundle.info.chunk, env), env, seed=3)
    assert bundle.info.chunk.ensemble == 0.2
    assert torch.allclose(shielded.returns, plain.float(), rtol=1e-5), (shielded.returns, plain)


@pytest.mark.mjx
@pytest.mark.timeout(600)
def test_gate_on_the_default_task_end_to_end(pendulum_run: Path) -> None:
    """Trained on native MuJoCo, gated on MJX (and through the ROS 2 node): the run keeps its return
    unperturbed (measured ratio 1.03 against its logged evaluation) and the table, JSON and plot are
    written."""
    rows = ["nominal", "all beyond"]
    report = run_gate(pendulum_run, episodes=4, only=rows, ros=True, ros_episodes=2, progress=lambda _: None)
    assert report["gate_backend"] == "mjx" and report["trained_backend"] == "mujoco"
    by_name = {r["name"]: r for r in report["rows"]}
    assert list(by_name) == ["shield", *rows, "via ROS 2 node"]
    assert by_name["nominal"]["ratio"] > 0.85
    # The ROS episodes start where the ramp hands over, judged against the same episodes as trained from
    # rest at the default pose (the sim reference's own, reported beside it).
    ros = by_name["via ROS 2 node"]
    assert report["ros_reference_return"] == pytest.approx(ros["mean"] / ros["ratio"], rel=1e-6)
    assert ros["ratio"] > 0.6 and ros["low"] is not None and ros["low"] <= ros["ratio"] <= ros["high"]
    assert 0.0 <= report["ros_shield_intervention_rate"] < 1.0 and report["ros_shield_change"] >= 0.0
    assert report["transfer_ratio_in_range"] == by_name["nominal"]["ratio"]
    assert not by_name["all beyond"]["required"]
    saved = json.loads((pendulum_run / "transfer.json").read_text())
    assert saved["rows"] == report["rows"]
    assert (pendulum_run / "transfer.png").stat().st_size > 1000


def test_the_gate_says_no_to_a_policy_trained_without_randomization(pendulum_run: Path, capsys) -> None:
    """The negative control: the committed pendulum run trained on nominal physics only. With the
    actuator 30 % weaker it no longer swings up on time (measured ratio 0.78, interval [0.74, 0.82] over
    16 episodes), so the gate fails it, and the CLI exits 1. Its progress counts every episode it ran:
    shielded and unshielded as trained, then the row."""
    report = run_gate(pendulum_run, backend="mujoco", episodes=6, only=["actuator_gain"], progress=lambda _: None)
    assert "gate: 18/18 episodes (100%)" in capsys.readouterr().err
    rows = {r["name"]: r for r in report["rows"]}
    assert rows["shield"]["passed"]
    weak = rows["actuator_gain"]
    assert not weak["in_range"] and weak["required"] and not weak["passed"] and weak["high"] < report["threshold"]
    assert not report["passed"] and report["failed_rows"] == ["actuator_gain"]


@pytest.mark.slow  # every row, 16 episodes each
@pytest.mark.timeout(600)
def test_the_gate_passes_the_panda_reach_bench_policy(panda_reach_run: Path) -> None:
    """The positive control: the bench's Panda reach policy, trained from its preset under every row the
    gate sizes for the arm, passes every required row in range, each with an interval (gated here on the
    training backend; the bench gates it on MJX)."""
    report = run_gate(panda_reach_run, backend="mujoco", progress=lambda _: None)
    required = [r for r in report["rows"] if r["required"]]
    assert {"payload", "pd_gains", "latency", "pushes", "all together"} <= {r["name"] for r in required}
    assert all(r["in_range"] and r["low"] is not None for r in required)
    assert report["passed"], report["failed_rows"]
    assert report["transfer_ratio_in_range_lower"] >= report["threshold"]


@pytest.mark.slow  # the gate over both backends: 4.3 s quiet
def test_the_gate_fails_a_policy_that_relies_on_what_the_shield_forbids(tmp_path: Path, pendulum_run: Path) -> None:
    """The shield row: the same episodes with and without the shield. A bundle whose robot's effort limit
    is a third of what the policy learned to use keeps far less of its return behind the shield."""
    import onnx

    from q2real.contracts.schema import METADATA_KEY, seal

    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        (run / name).write_bytes((pendulum_run / name).read_bytes())
    model = onnx.load(pendulum_run / "policy.onnx")
    entry = next(p for p in model.metadata_props if p.key == METADATA_KEY)
    meta = json.loads(entry.value)
    meta["robot"]["effort_limits"] = [limit / 3 for limit in meta["robot"]["effort_limits"]]
    entry.value = json.dumps(meta)
    onnx.save(model, run / "policy.onnx")
    seal(run / "policy.onnx")
    report = run_gate(run, backend="mujoco", episodes=8, only=["nominal"], progress=lambda _: None)
    shield = report["rows"][0]
    assert shield["name"] == "shield" and not shield["passed"] and shield["ratio"] < 0.9
    assert report["failed_rows"][0] == "shield"
    # The interventions are counted: the effort rule on most ticks of a swing-up, and by how much.
    assert report["shield_intervention_rate"] > 0.3 and report["shield_change"] > 0.05
    assert set(report["shield_rule_rates"]) == {"EFFORT_LIMIT"}


def test_gate_refuses_a_run_without_evaluations(tmp_path: Path, pendulum_run: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text((pendulum_run / "config.yaml").read_text())
    (run / "policy.onnx").write_bytes((pendulum_run / "policy.onnx").read_bytes())
    (run / "policy.onnx.json").write_text((pendulum_run / "policy.onnx.json").read_text())
    with pytest.raises(GateError, match="no eval_return logged"):
        run_gate(run, backend="mujoco", only=["nominal"], progress=lambda _: None)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval_return": 1.0}) + "\n")
    with pytest.raises(GateError, match=r"--only: unknown rows \['bogus'\]"):
        run_gate(run, backend="mujoco", only=["bogus"], progress=lambda _: None)
    report = run_gate(run, backend="mujoco", episodes=3, only=["nominal"], progress=lambda _: None)
    # Same backend, no perturbation, same episodes: the row is the reference itself.
    nominal = report["rows"][1]
    assert nominal["name"] == "nominal" and nominal["ratio"] == pytest.approx(1.0)
    assert nominal["low"] == pytest.approx(1.0) and report["transfer_ratio_in_range_lower"] == pytest.approx(1.0)
    assert report["in_training_return"] == 1.0 and report["passed"]
    assert math.isfinite(report["unshielded_return"])  # the same episodes without the shield
    # The pendulum has a safety cost (spinning past its velocity limit): every row reports it, and the
    # nominal row, the reference's own episodes, reports the reference's.
    assert nominal["cost"] == pytest.approx(report["reference_cost"]) and report["reference_cost"] >= 0


def test_perturbation_values_are_valid_randomization_configs() -> None:
    for robot in ("panda", "spot", "pendulum"):
        for trained in (RandomizationConfig(), RandomizationConfig(kp_scale=(0.9, 1.1), push_force=(1.0, 200.0))):
            for p in _rows(trained, robot).values():
                dataclasses.replace(p.randomization).validate(p.name)


@pytest.mark.slow  # real time through the node and the sim robot
@pytest.mark.timeout(600)
@pytest.mark.parametrize("task", ["spot_joystick", "gr1_stand", "panda_push"])
def test_the_ros_row_runs_legged_tasks_through_imu_and_cmd_vel(task: str, tmp_path: Path) -> None:
    """A legged run goes through the node on the sim robot: IMU and (for Spot) cmd_vel on the wire, the
    reward from the sim robot's ground truth, ending where the task terminates, as the simulated rows do;
    a push run with the cube's pose from the tracker, the cube starting where its simulated episode's did."""
    from q2real.agents.config import TrainConfig
    from q2real.configs.loader import to_dict
    from tests.deploy_ros.conftest import export_fresh_agent

    run = tmp_path / "run"
    run.mkdir()
    config = TrainConfig()
    env = dataclasses.replace(
        config.env, task=task, num_envs=1, backend="mujoco", device="cpu", task_params={"episode_length": 100}
    )
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(dataclasses.replace(config, env=env))))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval_return": 1.0}) + "\n")
    export_fresh_agent(task, run / "policy.onnx")
    report = run_gate(
        run, backend="mujoco", episodes=2, only=["nominal"], ros=True, ros_episodes=1, progress=lambda _: None
    )
    rows = {r["name"]: r for r in report["rows"]}
    ros, reference = rows["via ROS 2 node"], report["reference_return"]
    assert math.isfinite(ros["mean"]) and math.isfinite(reference)
    # An untrained policy: the row need not match the reference, but it is the task's reward over at
    # most one 100-step episode (GR1's lies in [0, 1] per step, Spot's tracking terms at most 1.5).
    if task == "gr1_stand":
        assert 0.0 < ros["mean"] <= 100.0
    elif task == "panda_push":  # the dense reward lies in [0, 1] per step, and the cube is far from no target
        assert 0.0 < ros["mean"] <= 100.0
    else:
        assert ros["mean"] <= 150.0


def test_the_ros_row_starts_each_episodes_object_where_its_simulated_episode_did() -> None:
    from q2real.gate.transfer import object_positions
    from q2real.sim import EnvConfig
    from q2real.sim.registry import make_task

    push = make_task(EnvConfig(task="panda_push", num_envs=3, backend="mujoco", device="cpu"))
    reach = make_task(EnvConfig(task="panda_reach", num_envs=2, backend="mujoco", device="cpu"))
    try:
        push.reset(seed=5)
        cubes = push.task.cube_position(push.physics).double().tolist()  # pyright: ignore[reportAttributeAccessIssue]
        assert object_positions(push) == [tuple(c) for c in cubes] and len({tuple(c) for c in cubes}) == 3
        reach.reset(seed=5)
        assert object_positions(reach) == [None, None]
    finally:
        push.close()
        reach.close()


def test_the_ratio_interval_pairs_each_episode_with_its_reference() -> None:
    """Paired episodes: a row that keeps 80 % of every episode's return has the interval [0.8, 0.8], however
    different the episodes are; the same returns unpaired from their episodes spread the interval out."""
    reference = torch.linspace(10.0, 100.0, 16)
    assert ratio_interval(0.8 * reference, reference) == pytest.approx((0.8, 0.8))
    low, high = ratio_interval(0.8 * reference.flip(0), reference)
    assert low < 0.7 and high > 0.9
    assert ratio_interval(torch.ones(1), torch.ones(1)) == (None, None)


def test_a_rate_of_episodes_has_a_wilson_interval_that_stays_in_range_and_never_collapses() -> None:
    low, high = wilson_interval(5, 32)
    assert (round(low, 3), round(high, 3)) == (0.069, 0.318), "5 falls in 32"
    assert wilson_interval(0, 32) == (0.0, pytest.approx(3.8415 / 35.8415, rel=1e-4)), "none in 32 is not 0 %"
    assert wilson_interval(32, 32)[1] == 1.0 and wilson_interval(32, 32)[0] < 1.0
    for n in (1, 7, 256):
        for hits in range(n + 1):
            low, high = wilson_interval(hits, n)
            assert 0.0 <= low <= hits / n <= high <= 1.0
    with pytest.raises(ValueError, match="at least one episode"):
        wilson_interval(0, 0)


def test_a_return_against_a_negative_reference_is_judged_by_the_returns_not_the_ratio() -> None:
    """Spot trained under the shield falls without it (as trained, no shield: -449); the ratio's sign then
    flips its meaning, so the row compares the returns themselves."""
    from q2real.gate.verdict import judged

    better = judged("shield", torch.tensor([300.0, 400.0]), torch.tensor([-400.0, -500.0]), 0.9)
    assert better.passed and better.ratio < 0
    worse = judged("row", torch.tensor([-600.0, -700.0]), torch.tensor([-400.0, -500.0]), 0.9)
    assert not worse.passed and worse.ratio > 1  # as a ratio it would have passed


def test_without_mjx_the_gate_says_it_runs_on_native_mujoco(monkeypatch) -> None:
    import importlib.util

    from q2real.gate import transfer

    said: list[str] = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "jax" else object())
    assert transfer._default_backend("mujoco", said.append) == "mujoco"
    assert "MJX is not installed (pip install 'q2real[mjx]')" in said[0] and "--backend mjx" in said[0]
    said.clear()
    assert transfer._default_backend("mjx", said.append) == "mujoco" and not said
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert transfer._default_backend("mujoco", said.append) == "mjx" and not said
