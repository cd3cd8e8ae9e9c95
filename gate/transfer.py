"""The sim-to-sim transfer gate: how much of its training return a policy keeps where it was not trained.

`q2real transfer RUN_DIR` takes the run's exported policy bundle (the file a robot would get) and
evaluates it through the safety shield on the *other* physics backend, first unperturbed, then under
each randomization effect at its training range ("in range") and widened beyond it ("beyond"), then
all of them together. Every row reports its mean return as a ratio of the in-training evaluation,
re-run on the same episodes as the rows: the same bundle and shield on the backend and with the
randomization the run trained with (the run's own logged evaluation is reported beside it; with ten
episodes it is too noisy to divide by). With `--ros` the unperturbed bundle also runs through the
ROS 2 node against the sim-in-the-loop robot, and its return is measured from the joint states on
the wire.

Effects the run did not train on are only tested "beyond", at default sizes: a policy trained without
latency meets one tick of it there.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from q2real.agents.config import load_run_config
from q2real.configs.errors import Q2RealError
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.deploy_ros.schema import robot_from_metadata
from q2real.hardware.action import action_from_command
from q2real.safety.shield import Shield, ShieldConfig
from q2real.sim import RandomizationConfig
from q2real.sim.config import resolve_backend
from q2real.sim.env import TaskEnv
from q2real.sim.registry import make_task

NEUTRAL = RandomizationConfig()
SCALES = ("mass_scale", "friction_scale", "damping_scale", "actuator_gain_scale", "kp_scale", "kd_scale")
# Effect name -> the fields it sets, and the value used "beyond" when the run did not train on it.
EFFECTS: dict[str, dict[str, object]] = {
    "mass": {"mass_scale": (0.7, 1.3)},
    "friction": {"friction_scale": (0.5, 1.5)},
    "joint_damping": {"damping_scale": (0.5, 2.0)},
    "actuator_gain": {"actuator_gain_scale": (0.8, 1.2)},
    "pd_gains": {"kp_scale": (0.7, 1.3), "kd_scale": (0.7, 1.3)},
    "com_offset": {"com_offset": 0.02},
    "armature": {"armature": (0.0, 0.02)},
    "obs_noise": {"obs_noise_std": 0.02},
    "obs_bias": {"obs_bias": 0.02},
    "latency": {"action_latency": (1, 1)},
    "pushes": {"push_force": (5.0, 10.0)},
}


class GateError(Q2RealError):
    """The gate cannot judge this run: an adapter task, no logged evaluation, an unknown row, a failed ROS row."""


@dataclass(frozen=True)
class Perturbation:
    name: str
    in_range: bool
    """True when every value lies within what the run was trained on."""
    randomization: RandomizationConfig


@dataclass
class Row:
    name: str
    in_range: bool
    mean: float
    std: float
    ratio: float
    low: float | None = None
    """2.5th percentile of the ratio over episode resamples paired with the reference's (None: one episode)."""
    high: float | None = None


BOOTSTRAP = 2000


def ratio_interval(returns: torch.Tensor, reference: torch.Tensor, seed: int = 0) -> tuple[float | None, float | None]:
    """95 % paired bootstrap interval of mean(returns) / mean(reference): episode i of a row ran from the
    same reset state as episode i of the reference, so both are resampled with the same indices."""
    n = len(returns)
    if n < 2:
        return None, None
    gen = torch.Generator().manual_seed(seed)
    index = torch.randint(0, n, (BOOTSTRAP, n), generator=gen)
    ratios = returns.double()[index].mean(1) / reference.double()[index].mean(1)
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return low, high


def _trained(config: RandomizationConfig, field: str) -> bool:
    return getattr(config, field) != getattr(NEUTRAL, field)


def _widen(field: str, value):
    """A range reaching past a trained one: twice its deviation from neutral (latency: one tick more)."""
    if field in SCALES:
        lo, hi = value
        return (max(0.05, 1 - 2 * (1 - lo)), 1 + 2 * (hi - 1))
    if field == "action_latency":
        return (value[1] + 1, value[1] + 1)
    if isinstance(value, tuple):
        return (value[0], 2 * value[1])
    return 2 * value


def perturbations(trained: RandomizationConfig) -> list[Perturbation]:
    """The gate's rows for a run trained with `trained` randomization."""
    # Pushes keep the run's own interval everywhere; it does nothing while push_force is zero.
    base = dataclasses.replace(NEUTRAL, push_interval=trained.push_interval)
    rows = [Perturbation("nominal", True, base)]
    together_in, together_beyond = {}, {}
    for name, defaults in EFFECTS.items():
        trained_fields = {f: getattr(trained, f) for f in defaults if _trained(trained, f)}
        if trained_fields:
            rows.append(Perturbation(name, True, dataclasses.replace(base, **trained_fields)))
            together_in.update(trained_fields)
        beyond = {f: _widen(f, trained_fields[f]) if f in trained_fields else d for f, d in defaults.items()}
        rows.append(Perturbation(f"{name} beyond", False, dataclasses.replace(base, **beyond)))
        together_beyond.update(beyond)
    if together_in:
        rows.append(Perturbation("all in range", True, dataclasses.replace(base, **together_in)))
    rows.append(Perturbation("all beyond", False, dataclasses.replace(base, **together_beyond)))
    return rows


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


def shielded_returns(bundle: PolicyBundle, env: TaskEnv, seed: int, shielded: bool = True) -> torch.Tensor:
    """Return of the first episode of every env, acting with the bundle through one shield per env
    (`shielded=False`: the bundle's actions straight to the env, as trained without a shield).

    Each env gets the shield a robot would run (rebuilt from the bundle's metadata), started directly
    in RUN from the task's reset state; what reaches the simulator is the shield's command, mapped back
    to the env's [-1, 1] action. Position robots take the shield's targets at the spec gains (the rare
    gain reduction of its effort rule is not simulated). The shields tick in a Python loop over envs on
    purpose: they are the robot's own per-robot code, and the gate is an evaluation, not a training loop."""
    meta = bundle.info.metadata
    spec = robot_from_metadata(meta, str(bundle.path))
    # The bundle's action mapping, as on the robot (the node hands it to its shield the same way).
    config = ShieldConfig(
        ramp_time=0.0,
        ramp_max_distance=math.inf,
        action_scale=tuple(meta["action"]["scale"]),
        action_offset=tuple(meta["action"]["offset"]),
    )
    shields = [Shield(spec, config) for _ in range(env.num_envs)]
    names, dt = spec.joint_names, spec.control_period
    task = env.task
    obs = env.reset(seed=seed)
    physics = env.physics
    returns = torch.zeros(env.num_envs)
    finished = torch.zeros(env.num_envs, dtype=torch.bool)
    scale, offset = shields[0].scale, shields[0].offset
    t = 0.0
    for shield, q, qd in zip(shields, *_joints(task, physics), strict=True):
        shield.tick(names, q, qd, t, t)
        shield.start()
        shield.run()
    while not bool(finished.all()):
        actions = bundle.normalized(bundle(obs.cpu().numpy()))
        q, qd = _joints(task, physics)
        commanded = np.empty_like(actions)
        for i, shield in enumerate(shields):
            if not shielded:
                commanded[i] = actions[i]
                continue
            command = shield.tick(names, q[i], qd[i], t, t, actions[i], 0.0)
            value = command.effort if shield.torque else command.position
            commanded[i] = action_from_command(value, scale, offset)
        result = env.step(torch.from_numpy(commanded).float().to(env.device))
        physics = env.physics
        returns += torch.where(finished, 0.0, result.reward.cpu())
        finished |= result.done.cpu()
        obs = result.obs
        t += dt
    return returns


def _joints(task, physics) -> tuple[np.ndarray, np.ndarray]:
    q = physics.qpos[:, task.qpos_index].double().cpu().numpy()
    qd = physics.qvel[:, task.qvel_index].double().cpu().numpy()
    return q, qd


def other_backend(trained: str) -> str:
    return "mjx" if resolve_backend(trained) == "mujoco" else "mujoco"


def run_gate(
    run_dir: str | Path,
    backend: str | None = None,
    episodes: int = 16,
    seed: int = 54321,
    only: list[str] | None = None,
    ros: bool = False,
    progress=print,
) -> dict:
    """Evaluate the run's bundle on every perturbation; writes RUN_DIR/transfer.json and transfer.png."""
    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    if ":" in config.env.task:
        raise GateError(f"{run_dir}: env.task '{config.env.task}': the gate needs a q2real task, not an adapter")
    bundle_path = run_dir / "policy.onnx"
    if not bundle_path.is_file():
        from q2real.agents.export import export_run

        export_run(run_dir)
    bundle = PolicyBundle(bundle_path)
    logged = in_training_return(run_dir)
    trained_backend = resolve_backend(config.env.backend)
    backend = backend or other_backend(trained_backend)
    rows_wanted = perturbations(config.env.randomization)
    if only:
        unknown = sorted(set(only) - {p.name for p in rows_wanted})
        if unknown:
            raise GateError(f"--only: unknown rows {unknown}; this run's rows: {[p.name for p in rows_wanted]}")
        rows_wanted = [p for p in rows_wanted if p.name in only]

    def returns_on(on: str, randomization: RandomizationConfig, shielded: bool = True) -> torch.Tensor:
        env = make_task(
            dataclasses.replace(
                config.env,
                backend=on,
                device="cpu",
                num_envs=episodes,
                seed=seed,
                randomization=randomization,
                shield_in_loop=False,  # the robot's own shields, one per env, stand in for it
            )
        )
        try:
            return shielded_returns(bundle, env, seed, shielded)
        finally:
            env.close()

    # The reference: the same bundle and shield on the very episodes of every row, as in training
    # (trained backend, trained randomization), so row ratios are paired, not two noisy means.
    reference_returns = returns_on(trained_backend, config.env.randomization)
    reference = float(reference_returns.mean())
    progress(f"  {'as trained':<24} {'reference':<9} return {reference:9.2f}   (logged evaluation {logged:.2f})")
    # What the shield costs: the same episodes with the bundle's actions unshielded.
    unshielded = float(returns_on(trained_backend, config.env.randomization, shielded=False).mean())
    progress(f"  {'as trained, no shield':<24} {'':<9} return {unshielded:9.2f}   ratio {unshielded / reference:6.3f}")
    rows: list[Row] = []
    for p in rows_wanted:
        returns = returns_on(backend, p.randomization)
        mean = float(returns.mean())
        low, high = ratio_interval(returns, reference_returns)
        row = Row(p.name, p.in_range, mean, float(returns.std()), mean / reference, low, high)
        rows.append(row)
        progress(
            f"  {row.name:<24} {'in range' if row.in_range else 'beyond':<9} return {row.mean:9.2f} "
            f"+- {row.std:7.2f}   ratio {row.ratio:6.3f} {_interval(row)}"
        )
    if ros:
        from q2real.gate.ros import ros_return

        mean = ros_return(bundle_path, config, progress)
        rows.append(Row("nominal via ROS 2 node", True, mean, 0.0, mean / reference))
        progress(f"  {'nominal via ROS 2 node':<24} {'in range':<9} return {mean:9.2f}   ratio {mean / reference:6.3f}")
    together = [r for r in rows if r.name == "all in range"] or [r for r in rows if r.name == "nominal"]
    report = {
        "run_dir": str(run_dir),
        "task": config.env.task,
        "trained_backend": trained_backend,
        "gate_backend": backend,
        "episodes": episodes,
        "reference_return": reference,
        "unshielded_return": unshielded,
        "in_training_return": logged,
        "rows": [dataclasses.asdict(r) for r in rows],
        "transfer_ratio_in_range": together[0].ratio if together else None,
        "min_ratio_in_range": min((r.ratio for r in rows if r.in_range), default=None),
        "transfer_ratio_in_range_lower": min((r.low for r in rows if r.in_range and r.low is not None), default=None),
    }
    (run_dir / "transfer.json").write_text(json.dumps(report, indent=2))
    _plot(report, run_dir / "transfer.png")
    return report


def _interval(row: Row) -> str:
    return "" if row.low is None or row.high is None else f"[{row.low:.3f}, {row.high:.3f}]"


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.2))
    colors = ["tab:green" if r["in_range"] else "tab:orange" for r in rows]
    ratios = [r["ratio"] for r in rows][::-1]
    errors = [
        [max(r["ratio"] - r["low"], 0.0) if r["low"] is not None else 0.0 for r in rows][::-1],
        [max(r["high"] - r["ratio"], 0.0) if r["high"] is not None else 0.0 for r in rows][::-1],
    ]
    ax.barh([r["name"] for r in rows][::-1], ratios, color=colors[::-1], xerr=errors, capsize=2)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(0.9, color="k", lw=0.8, ls="--")
    ax.set_xlabel(f"return / return as trained ({report['reference_return']:.1f}, same episodes)")
    ax.set_title(f"{report['task']}: trained on {report['trained_backend']}, gated on {report['gate_backend']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
