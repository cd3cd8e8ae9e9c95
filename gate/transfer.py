"""The sim-to-sim transfer gate: whether a policy keeps its return where it was not trained, with the power to say no.

`q2real transfer RUN_DIR` takes the run's exported policy bundle (the file a robot would get) and
evaluates it through the safety shield on the *other* physics backend: unperturbed, under each effect
the robot will meet (sized for that robot, `q2real.gate.perturbations`), all of them together, and all
of them widened past anything trained. Every row's return is a ratio of the return as trained: the
same bundle and shield on the training backend with the training randomization, on the very same
episodes (same reset states, same commands), so each ratio carries a paired 95 % bootstrap interval.
A row passes when its interval's lower end clears the threshold (0.9); the gate passes when every
required row does, including "shield": the return as trained with the shield over the return without
it, so a policy that relies on moves the robot's shield will not allow fails here and not on the robot.
With `--ros` the bundle also runs through the ROS 2 node against the sim-in-the-loop robot over
several of the same episodes, its return measured from the joint states on the wire, against those
episodes as trained but started where the node's start ramp hands over (at rest, at the default pose).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import mujoco
import torch

from q2real.agents.common.progress import Progress
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.gate.evaluation import export_for_run, run_env_config
from q2real.gate.perturbations import Perturbation, perturbations
from q2real.gate.ros import ros_returns
from q2real.gate.shielded import Episodes, shielded_returns
from q2real.gate.verdict import THRESHOLD, GateError, Row, interval_text, judged
from q2real.hardware import robot_spec
from q2real.hardware.model import load_model
from q2real.sim import RandomizationConfig
from q2real.sim.config import resolve_backend, target_actions
from q2real.sim.env import TaskEnv
from q2real.sim.registry import make_task

ROS_EPISODES = 8
"""Episodes through the ROS 2 node by default: each takes real time."""


def in_training_return(run_dir: Path) -> float:
    """The run's last logged evaluation return (its own eval episodes; reported beside the reference)."""
    evals = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            if "eval_return" in record:
                evals.append(record["eval_return"])
    if not evals:
        raise GateError(f"{metrics}: no eval_return logged; the gate compares against the run's own evaluation")
    return float(evals[-1])


def other_backend(trained: str) -> str:
    return "mjx" if resolve_backend(trained) == "mujoco" else "mujoco"


def _default_backend(trained: str, progress) -> str:
    """The backend the run did not train on, or, where MJX is not installed (the quick start installs
    only native MuJoCo), the native one, said so: the rows then test perturbations, not the backend."""
    backend = other_backend(trained)
    if backend == "mjx" and not all(importlib.util.find_spec(name) for name in ("jax", "mujoco.mjx")):
        progress(
            "  gate backend: MJX is not installed (pip install 'q2real[mjx]'), so the rows run on mujoco, the "
            "backend the run trained on; --backend mjx gates across backends once MJX is there"
        )
        return "mujoco"
    return backend


def run_gate(
    run_dir: str | Path,
    backend: str | None = None,
    episodes: int = 16,
    seed: int = 54321,
    only: list[str] | None = None,
    ros: bool = False,
    ros_episodes: int | None = None,
    threshold: float = THRESHOLD,
    progress=print,
) -> dict:
    """Evaluate the run's bundle on every row; writes RUN_DIR/transfer.json and transfer.png.
    `ros_episodes`: episodes through the node (None: `ROS_EPISODES`, or `episodes` if fewer)."""
    gate = TransferGate(Path(run_dir), backend, episodes, seed, only, ros, ros_episodes, threshold, progress)
    try:
        rows = [gate.shield_row(), *gate.perturbed_rows()]
        if ros:
            rows.append(gate.ros_row())
    finally:
        gate.meter.close()
    report = gate.report(rows)
    verdict = "PASSED" if report["passed"] else f"FAILED on {', '.join(report['failed_rows'])}"
    progress(f"  gate {verdict} (a row passes when its interval's lower end is at least {threshold})")
    (gate.run_dir / "transfer.json").write_text(json.dumps(report, indent=2))
    _plot(report, gate.run_dir / "transfer.png")
    return report


class TransferGate:
    """One gate run, step by step: the reference (the bundle as trained), the shield's row, a row per
    perturbation, the ROS 2 row, and the report."""

    def __init__(
        self,
        run_dir: Path,
        backend: str | None,
        episodes: int,
        seed: int,
        only: list[str] | None,
        ros: bool,
        ros_episodes: int | None,
        threshold: float,
        progress,
    ):
        env_config = run_env_config(run_dir)  # any run kind: off-policy, BC, residual
        if ":" in env_config.task:
            raise GateError(f"{run_dir}: env.task '{env_config.task}': the gate needs a q2real task, not an adapter")
        if not 0 < threshold <= 1:
            raise GateError(f"threshold: expected a ratio in (0, 1], got {threshold}")
        ros_episodes = min(ROS_EPISODES, episodes) if ros_episodes is None else ros_episodes
        if ros and not 1 <= ros_episodes <= episodes:
            raise GateError(f"ros_episodes: expected 1 to episodes ({episodes}), got {ros_episodes}")
        self.run_dir, self.env_config, self.episodes, self.seed = run_dir, env_config, episodes, seed
        self.ros_episodes, self.threshold, self.progress = ros_episodes, threshold, progress
        self.bundle_path = run_dir / "policy.onnx"
        if not self.bundle_path.is_file():
            export_for_run(run_dir)
        self.bundle = PolicyBundle(self.bundle_path)
        self.logged = in_training_return(run_dir)
        self.trained_backend = resolve_backend(env_config.backend)
        self.backend = backend or _default_backend(self.trained_backend, progress)
        self.spec = robot_spec(self.bundle.info.metadata["robot"]["name"])
        self.perturbations = _chosen(perturbations(env_config.randomization, self.spec, load_model(self.spec)), only)
        # Two passes as trained (shielded and not), one per row, then the ROS 2 row's reference (as trained,
        # from the default pose) and its episodes in real time.
        total = (2 + len(self.perturbations)) * episodes + (episodes + ros_episodes if ros else 0)
        self.meter = Progress(total, "gate", unit="episode")
        self.as_trained: Episodes | None = None
        self.unshielded: torch.Tensor | None = None
        self.ros_rate: float | None = None
        """The ROS 2 row's share of ticks on which a shield clamp changed the command, and by how much."""
        self.ros_change: float | None = None
        self.ros_reference: torch.Tensor | None = None
        """The ROS 2 row's reference returns: its episodes as trained, from the default pose."""

    def env_on(self, on: str, randomization: RandomizationConfig, num_envs: int | None = None) -> TaskEnv:
        return make_task(
            dataclasses.replace(
                target_actions(self.env_config),
                backend=on,
                device="cpu",
                num_envs=num_envs or self.episodes,
                seed=self.seed,
                randomization=randomization,
                shield_in_loop=False,  # the robot's own shields, one per env, stand in for it
                shield_penalty=0.0,  # and the return is the task's, not training's
            )
        )

    def episodes_on(
        self, on: str, randomization: RandomizationConfig, shielded: bool = True, from_default_pose: bool = False
    ) -> Episodes:
        env = self.env_on(on, randomization)
        try:
            return shielded_returns(self.bundle, env, self.seed, shielded, self.meter.update, from_default_pose)
        finally:
            env.close()

    @property
    def reference(self) -> torch.Tensor:
        assert self.as_trained is not None, "shield_row() runs first"
        return self.as_trained.returns

    def show(self, row: Row) -> None:
        verdict = "pass" if row.passed else "FAIL" if row.required else "-"
        kind = "in range" if row.in_range else "beyond"
        cost = f"   cost {row.cost:7.2f}" if row.cost is not None else ""
        self.progress(
            f"  {row.name:<22} {kind:<9} return {row.mean:9.2f} +- {row.std:7.2f}   ratio {row.ratio:6.3f} "
            f"{interval_text(row):<16} {verdict:<4}{cost}  {row.magnitude}"
        )

    def shield_row(self) -> Row:
        """The reference: the same bundle and shield on the very episodes of every row, as in training
        (trained backend, trained randomization), so row ratios are paired, not two noisy means; then
        what the shield costs: the same episodes with the bundle's actions straight to the simulator."""
        trained = self.env_config.randomization
        self.as_trained = as_trained = self.episodes_on(self.trained_backend, trained)
        cost = f", episode cost {float(as_trained.costs.mean()):.2f}" if as_trained.has_cost else ""
        rules = ", ".join(f"{k} {100 * v:.1f} %" for k, v in as_trained.rules.items()) or "no rule acted"
        self.progress(
            f"  {'as trained':<22} {'reference':<9} return {float(self.reference.mean()):9.2f}{cost}   (logged "
            f"evaluation {self.logged:.2f}); the shield changed the command on {100 * as_trained.interventions:.1f} "
            f"% of ticks ({rules}), by {as_trained.change:.3f} per joint and tick in action units"
        )
        self.unshielded = self.episodes_on(self.trained_backend, trained, shielded=False).returns
        self.progress(f"  {'as trained, no shield':<22} {'':<9} return {float(self.unshielded.mean()):9.2f}")
        row = judged("shield", self.reference, self.unshielded, self.threshold, magnitude="with / without")
        self.show(row)
        return row

    def perturbed_rows(self) -> list[Row]:
        """A row per perturbation on the gate's backend; a constrained run's cost is shown beside its
        return, not judged."""
        rows = []
        for p in self.perturbations:
            ran = self.episodes_on(self.backend, p.randomization)
            row = judged(p.name, ran.returns, self.reference, self.threshold, p.in_range, p.magnitude, p.required)
            rows.append(dataclasses.replace(row, cost=float(ran.costs.mean()) if ran.has_cost else None))
            self.show(rows[-1])
        return rows

    def ros_row(self) -> Row:
        """The first episodes of the reference, each through the ROS 2 node on the sim robot in real time,
        against the same episodes as trained but started where the node's ramp hands over (the robot at
        rest at its default pose), not from the reset state the node ramps away from. A torque robot's ramp
        only damps: a pendulum comes to rest hanging, its default pose, near enough; where a passive joint
        would rest elsewhere this reference is an approximation."""
        env = self.env_on(self.trained_backend, self.env_config.randomization)  # its reset stream: all envs
        try:
            env.reset(seed=self.seed)
            q = env.physics.qpos[:, env.task.qpos_index].double().numpy()
            objects = object_positions(env)
            starts = [
                (dict(zip(self.spec.joint_names, q[i].tolist(), strict=True)), env.task.command[i], objects[i])
                for i in range(self.ros_episodes)
            ]
        finally:
            env.close()
        handed_over = self.episodes_on(self.trained_backend, self.env_config.randomization, from_default_pose=True)
        reference = self.ros_reference = handed_over.returns[: self.ros_episodes]
        returns, self.ros_rate, self.ros_change = ros_returns(
            self.bundle_path, self.env_config, starts, self.progress, self.meter.update
        )
        self.progress(
            f"  {'as trained, from rest':<22} {'reference':<9} return {float(reference.mean()):9.2f}   (the "
            "ROS 2 row's: its episodes start where the node's ramp hands over, the default pose)"
        )
        row = judged("via ROS 2 node", returns, reference, self.threshold, magnitude="nominal, from the default pose")
        self.show(row)
        return row

    def report(self, rows: list[Row]) -> dict:
        as_trained, unshielded = self.as_trained, self.unshielded
        assert as_trained is not None and unshielded is not None
        judged_rows = [r for r in rows if r.required]
        transfer = rows[1:]  # every row but the shield's is a ratio to the return as trained
        together = [r for r in rows if r.name == "all together"] or [r for r in rows if r.name == "nominal"]
        return {
            "run_dir": str(self.run_dir),
            "task": self.env_config.task,
            "trained_backend": self.trained_backend,
            "gate_backend": self.backend,
            "episodes": self.episodes,
            "threshold": self.threshold,
            "reference_return": float(as_trained.returns.mean()),
            "reference_cost": float(as_trained.costs.mean()) if as_trained.has_cost else None,
            "unshielded_return": float(unshielded.mean()),
            "in_training_return": self.logged,
            "rows": [dataclasses.asdict(r) for r in rows],
            "passed": all(r.passed for r in judged_rows),
            "failed_rows": [r.name for r in judged_rows if not r.passed],
            "transfer_ratio_in_range": together[0].ratio if together else None,
            "min_ratio_in_range": min((r.ratio for r in transfer if r.in_range), default=None),
            "transfer_ratio_in_range_lower": min(
                (r.ratio if r.low is None else r.low for r in transfer if r.in_range), default=None
            ),
            "shield_intervention_rate": as_trained.interventions,
            "shield_change": as_trained.change,
            "shield_rule_rates": as_trained.rules,
            "ros_reference_return": None if self.ros_reference is None else float(self.ros_reference.mean()),
            "ros_shield_intervention_rate": self.ros_rate,
            "ros_shield_change": self.ros_change,
        }


def _chosen(rows: list[Perturbation], only: list[str] | None) -> list[Perturbation]:
    if not only:
        return rows
    unknown = sorted(set(only) - {p.name for p in rows})
    if unknown:
        raise GateError(f"--only: unknown rows {unknown}; this run's rows: {[p.name for p in rows]}")
    return [p for p in rows if p.name in only]


def object_positions(env: TaskEnv) -> list[tuple[float, float, float] | None]:
    """Per env, where its tracked object starts (x, y, z), for the sim robot to start it there too;
    None for every env of a task without one."""
    task = env.task
    if task.tracked_object is None:
        return [None] * env.num_envs
    model = task.model
    body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, task.tracked_object)
    q = int(model.jnt_qposadr[int(model.body_jntadr[body])])
    return [tuple(row) for row in env.physics.qpos[:, q : q + 3].double().tolist()]


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.2))
    colors = ["tab:gray" if not r["required"] else "tab:green" if r["passed"] else "tab:red" for r in rows]
    ratios = [r["ratio"] for r in rows][::-1]
    errors = [
        [max(r["ratio"] - r["low"], 0.0) if r["low"] is not None else 0.0 for r in rows][::-1],
        [max(r["high"] - r["ratio"], 0.0) if r["high"] is not None else 0.0 for r in rows][::-1],
    ]
    labels = [r["name"] + ("" if r["in_range"] else " (beyond)") for r in rows]
    ax.barh(labels[::-1], ratios, color=colors[::-1], xerr=errors, capsize=2)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(report["threshold"], color="k", lw=0.8, ls="--")
    ax.set_xlabel(
        f"return / return as trained ({report['reference_return']:.1f}, same episodes; shield: with / without)"
    )
    verdict = "passed" if report["passed"] else "failed"
    ax.set_title(
        f"{report['task']}: trained on {report['trained_backend']}, gated on {report['gate_backend']}: {verdict}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
