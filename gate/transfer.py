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
several of the same episodes, its return measured from the joint states on the wire.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np
import torch

from q2real.agents.common.progress import Progress
from q2real.configs.errors import Q2RealError
from q2real.contracts.chunks import ChunkQueue
from q2real.contracts.schema import robot_from_metadata
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.gate.evaluation import export_for_run, run_env_config
from q2real.gate.perturbations import perturbations
from q2real.hardware import robot_spec
from q2real.hardware.action import action_from_command
from q2real.hardware.model import load_model
from q2real.safety.compiled import Shield
from q2real.safety.flags import CLAMPS
from q2real.safety.shield import ShieldConfig
from q2real.sim import RandomizationConfig
from q2real.sim.config import resolve_backend, target_actions
from q2real.sim.env import TaskEnv
from q2real.sim.registry import make_task

THRESHOLD = 0.9
"""A row passes when the lower end of its ratio's interval is at least this."""
ROS_EPISODES = 8


class GateError(Q2RealError):
    """The gate cannot judge this run: an adapter task, no logged evaluation, an unknown row, a failed ROS row."""


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
    magnitude: str = "-"
    required: bool = True
    """Counted in the verdict (the stress row is not)."""
    passed: bool = True
    """The interval's lower end (the ratio itself for one episode) clears the threshold."""
    cost: float | None = None
    """Mean episode safety cost, for a task with one (reported beside the return, not judged)."""


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


def judged(
    name: str,
    returns: torch.Tensor,
    reference: torch.Tensor,
    threshold: float,
    in_range: bool = True,
    magnitude: str = "-",
    required: bool = True,
) -> Row:
    """A row of `returns` against the `reference` returns of the same episodes. Where the reference's
    mean return is not positive a ratio says nothing (a policy that falls without the shield scores
    below zero): the row passes when its mean return is at least the reference's."""
    mean, ratio = float(returns.mean()), float(returns.mean() / reference.mean())
    low, high = ratio_interval(returns, reference)
    std = float(returns.std()) if len(returns) > 1 else 0.0
    if float(reference.mean()) <= 0:
        passed = mean >= float(reference.mean())
    else:
        passed = (ratio if low is None else low) >= threshold
    return Row(name, in_range, mean, std, ratio, low, high, magnitude, required, passed)


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


@dataclass
class Episodes:
    returns: torch.Tensor
    """Of the first episode of every env."""
    costs: torch.Tensor
    """Safety cost of the same episodes (zeros for a task without one)."""
    interventions: float
    """Fraction of the episodes' ticks on which a shield clamp changed the policy's command."""
    change: float
    """Mean over the episodes' ticks of how far the clamps moved the command (mean over joints, in
    action units; `q2real.safety.shield.Counters.run_change`)."""
    rules: dict[str, float]
    """Fraction of the episodes' ticks on which each clamp rule acted (those that ever did)."""
    has_cost: bool = False
    """The task defines a safety cost (`costs` then means something)."""


def shielded_returns(
    bundle: PolicyBundle, env: TaskEnv, seed: int, shielded: bool = True, ended: Callable[[int], None] | None = None
) -> Episodes:
    """The first episode of every env, acting with the bundle through one shield per env
    (`shielded=False`: the bundle's actions straight to the env, as trained without a shield);
    `ended(n)` hears of each step's newly ended episodes.

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
    chunk = bundle.info.chunk
    chunks = ChunkQueue(chunk, env.num_envs, env.action_dim, np) if chunk.size > 1 else None
    names, dt = spec.joint_names, spec.control_period
    task = env.task
    obs = env.reset(seed=seed)
    physics = env.physics
    returns = torch.zeros(env.num_envs)
    costs = torch.zeros(env.num_envs)
    finished = torch.zeros(env.num_envs, dtype=torch.bool)
    flags = np.zeros(env.num_envs, dtype=np.int64)
    fired = {str(rule.name): 0 for rule in CLAMPS}
    ticks = interventions = 0
    change = 0.0
    scale, offset = shields[0].scale, shields[0].offset
    # A `last_action` term is the policy's own previous output on the robot; the env saw the shield's.
    last = env.term_columns("last_action")
    t = 0.0
    for shield, q, qd in zip(shields, *_joints(task, physics), strict=True):
        shield.tick(names, q, qd, t, t)
        shield.start()
        shield.run()
    while not bool(finished.all()):
        actions = bundle.normalized(bundle(obs[:, : env.policy_obs_dim].cpu().numpy()))
        if chunks is not None:  # each env's chunk executed as the node executes it, each tick shielded
            actions = chunks.act(actions)
        q, qd = _joints(task, physics)
        commanded = np.empty_like(actions)
        for i, shield in enumerate(shields):
            if not shielded:
                commanded[i] = actions[i]
                continue
            command = shield.tick(names, q[i], qd[i], t, t, actions[i], 0.0)
            value = command.effort if shield.torque else command.position
            commanded[i] = action_from_command(value, scale, offset)
            flags[i] = command.flags
        if shielded:
            running = ~finished.numpy()
            counted = flags[running]
            ticks += len(counted)
            clamped = (counted & int(CLAMPS)) != 0
            interventions += int(np.count_nonzero(clamped))
            change += float(np.abs(commanded - actions)[running][clamped].mean(-1).sum())
            for rule in CLAMPS:
                fired[str(rule.name)] += int(np.count_nonzero(counted & int(rule)))
        result = env.step(torch.from_numpy(commanded).float().to(env.device))
        physics = env.physics
        returns += torch.where(finished, 0.0, result.reward.cpu())
        costs += torch.where(finished, 0.0, result.cost.cpu())
        if ended is not None:
            ended(int((result.done.cpu() & ~finished).sum()))
        finished |= result.done.cpu()
        obs = result.obs
        if last is not None:
            obs[:, last] = torch.from_numpy(np.clip(actions, -1.0, 1.0)).to(obs)
        t += dt
    rules = {name: n / max(ticks, 1) for name, n in fired.items() if n}
    return Episodes(returns, costs, interventions / max(ticks, 1), change / max(ticks, 1), rules, env.has_cost)


def _joints(task, physics) -> tuple[np.ndarray, np.ndarray]:
    q = physics.qpos[:, task.qpos_index].double().cpu().numpy()
    qd = physics.qvel[:, task.qvel_index].double().cpu().numpy()
    return q, qd


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
    run_dir = Path(run_dir)
    env_config = run_env_config(run_dir)  # any run kind: off-policy, BC, residual
    if ":" in env_config.task:
        raise GateError(f"{run_dir}: env.task '{env_config.task}': the gate needs a q2real task, not an adapter")
    if not 0 < threshold <= 1:
        raise GateError(f"threshold: expected a ratio in (0, 1], got {threshold}")
    if ros_episodes is None:
        ros_episodes = min(ROS_EPISODES, episodes)
    if ros and not 1 <= ros_episodes <= episodes:
        raise GateError(f"ros_episodes: expected 1 to episodes ({episodes}), got {ros_episodes}")
    bundle_path = run_dir / "policy.onnx"
    if not bundle_path.is_file():
        export_for_run(run_dir)
    bundle = PolicyBundle(bundle_path)
    logged = in_training_return(run_dir)
    trained_backend = resolve_backend(env_config.backend)
    backend = backend or _default_backend(trained_backend, progress)
    spec = robot_spec(bundle.info.metadata["robot"]["name"])
    rows_wanted = perturbations(env_config.randomization, spec, load_model(spec))
    if only:
        unknown = sorted(set(only) - {p.name for p in rows_wanted})
        if unknown:
            raise GateError(f"--only: unknown rows {unknown}; this run's rows: {[p.name for p in rows_wanted]}")
        rows_wanted = [p for p in rows_wanted if p.name in only]

    def env_on(on: str, randomization: RandomizationConfig, num_envs: int = episodes) -> TaskEnv:
        return make_task(
            dataclasses.replace(
                target_actions(env_config),
                backend=on,
                device="cpu",
                num_envs=num_envs,
                seed=seed,
                randomization=randomization,
                shield_in_loop=False,  # the robot's own shields, one per env, stand in for it
                shield_penalty=0.0,  # and the return is the task's, not training's
            )
        )

    def returns_on(on: str, randomization: RandomizationConfig, shielded: bool = True) -> torch.Tensor:
        return episodes_on(on, randomization, shielded).returns

    # Two passes as trained (shielded and not), one per row, then the ROS 2 row's episodes in real time.
    meter = Progress((2 + len(rows_wanted)) * episodes + (ros_episodes if ros else 0), "gate", unit="episode")

    def episodes_on(on: str, randomization: RandomizationConfig, shielded: bool = True) -> Episodes:
        env = env_on(on, randomization)
        try:
            return shielded_returns(bundle, env, seed, shielded, ended=meter.update)
        finally:
            env.close()

    def show(row: Row) -> None:
        verdict = "pass" if row.passed else "FAIL" if row.required else "-"
        kind = "in range" if row.in_range else "beyond"
        cost = f"   cost {row.cost:7.2f}" if row.cost is not None else ""
        progress(
            f"  {row.name:<22} {kind:<9} return {row.mean:9.2f} +- {row.std:7.2f}   ratio {row.ratio:6.3f} "
            f"{_interval(row):<16} {verdict:<4}{cost}  {row.magnitude}"
        )

    # The reference: the same bundle and shield on the very episodes of every row, as in training
    # (trained backend, trained randomization), so row ratios are paired, not two noisy means.
    as_trained = episodes_on(trained_backend, env_config.randomization)
    reference_returns = as_trained.returns
    reference_cost = float(as_trained.costs.mean()) if as_trained.has_cost else None
    reference = float(reference_returns.mean())
    progress(
        f"  {'as trained':<22} {'reference':<9} return {reference:9.2f}"
        + (f", episode cost {reference_cost:.2f}" if reference_cost is not None else "")
        + f"   (logged evaluation {logged:.2f}); "
        f"the shield changed the command on {100 * as_trained.interventions:.1f} % of ticks "
        f"({', '.join(f'{k} {100 * v:.1f} %' for k, v in as_trained.rules.items()) or 'no rule acted'}), "
        f"by {as_trained.change:.3f} per joint and tick in action units"
    )
    # What the shield costs: the same episodes with the bundle's actions straight to the simulator.
    unshielded_returns = returns_on(trained_backend, env_config.randomization, shielded=False)
    shield_row = judged("shield", reference_returns, unshielded_returns, threshold, magnitude="with / without")
    progress(f"  {'as trained, no shield':<22} {'':<9} return {float(unshielded_returns.mean()):9.2f}")
    show(shield_row)
    rows: list[Row] = [shield_row]
    for p in rows_wanted:
        ran = episodes_on(backend, p.randomization)
        judgement = judged(p.name, ran.returns, reference_returns, threshold, p.in_range, p.magnitude, p.required)
        # A constrained run's other half of the result: shown beside the return, not judged.
        rows.append(dataclasses.replace(judgement, cost=float(ran.costs.mean()) if ran.has_cost else None))
        show(rows[-1])
    ros_rate = ros_change = None
    if ros:
        from q2real.gate.ros import ros_returns

        # The reference's own episodes: its env (all `episodes` envs, one reset stream), the first few rows.
        env = env_on(trained_backend, env_config.randomization)
        try:
            env.reset(seed=seed)
            q = env.physics.qpos[:, env.task.qpos_index].double().numpy()
            objects = object_positions(env)
            starts = [
                (dict(zip(spec.joint_names, q[i].tolist(), strict=True)), env.task.command[i], objects[i])
                for i in range(ros_episodes)
            ]
        finally:
            env.close()
        returns, ros_rate, ros_change = ros_returns(bundle_path, env_config, starts, progress, meter.update)
        rows.append(judged("via ROS 2 node", returns, reference_returns[:ros_episodes], threshold, magnitude="nominal"))
        show(rows[-1])
    judged_rows = [r for r in rows if r.required]
    transfer = rows[1:]  # every row but the shield's is a ratio to the return as trained
    together = [r for r in rows if r.name == "all together"] or [r for r in rows if r.name == "nominal"]
    report = {
        "run_dir": str(run_dir),
        "task": env_config.task,
        "trained_backend": trained_backend,
        "gate_backend": backend,
        "episodes": episodes,
        "threshold": threshold,
        "reference_return": reference,
        "reference_cost": reference_cost,
        "unshielded_return": float(unshielded_returns.mean()),
        "in_training_return": logged,
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
        "ros_shield_intervention_rate": ros_rate,
        "ros_shield_change": ros_change,
    }
    meter.close()
    verdict = "PASSED" if report["passed"] else f"FAILED on {', '.join(report['failed_rows'])}"
    progress(f"  gate {verdict} (a row passes when its interval's lower end is at least {threshold})")
    (run_dir / "transfer.json").write_text(json.dumps(report, indent=2))
    _plot(report, run_dir / "transfer.png")
    return report


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


def _interval(row: Row) -> str:
    return "" if row.low is None or row.high is None else f"[{row.low:.3f}, {row.high:.3f}]"


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
