"""A nominally trained bundle on the sim robot, a dynamics shift, and fine-tuning on the robot's stream.

Per task (`--task`, results merged into one file):

- `pendulum`: the committed pendulum run (`tests/fixtures/pendulum_run`, SAC trained on nominal
  dynamics). The robot is knocked to a random angle every 10 s (the same seeded sequence in every
  run, so each 10 s is one swing-up episode), and `--shift-at` seconds after its first command its
  actuator loses half its gain (`actuator_gain_scale=0.5`).
- `panda_reach`: the committed reach run (`bench/results/finetune/panda_reach_run`, the
  `sac_panda_reach` preset: randomized dynamics with payloads up to the rated 3 kg), reaching for
  the task's own targets, a new one every 2 s episode (`--task-commands`), its joints reset near the
  home pose between episodes; at `--shift-at`, 8 kg hang on its last link (`payload=8`), beyond the
  range it trained on. Its reward is computed by the learner from the stream: forward kinematics on
  the joint states, the target from the observation (`q2real.sim.streamed`). The node's trial segments
  are one episode long (`finetune.segment=100`, at most 20 pairs): a reach has a cycle (move, then
  hold), and segments of a quarter of it would set one version's turn on the move against the other's
  on the hold.

Each is deployed with `q2real deploy --sim` on the sim robot, in real time over DDS loopback
(50 Hz). Three runs of the same length:

  frozen      the bundle as deployed, no noise; the learner process runs but never moves the actor
              (it only scores the ticks: the reward is computed the same way in both runs)
  fine-tuned  `--finetune`: noise 0.3 bounded 0.5 for pendulum, the node's default 0.1 / 0.3 for the
              arm (`--noise`), the rest at its defaults: a version every 5 s once the actor moves
              (after 3000 transitions), each on trial in turns with the last good version
  no learner  plain deploy, for the node's tick latency without a learner beside it (shorter)

`--methods free anchored` runs the fine-tuned run once per learner method (`METHODS`) beside the same
frozen and no-learner runs: `free`, the actor follows its critic alone; `anchored`, the actor loss also
pays for its distance from the last version the node judged good (`FinetuneConfig.anchor`).

On the robot, return is the mean reward per tick over one episode's window (10 s, 2 s) times its
ticks, with the exploration noise in it. Every version the node swapped in is also evaluated offline, without
noise, on 32 seeded episodes of the shifted simulator. Headline keys: `recovered_return_ratio` (the
node's last good version, offline on the shifted dynamics ÷ the deployed bundle offline on nominal
dynamics: the pre-shift level), beside `frozen_return_ratio` (the deployed bundle on the shifted
dynamics ÷ the same), and `tick_p99_ratio_with_learner` (the fine-tuned run's tick latency p99 ÷ the
no-learner run's), with `loop_deadline_miss_fraction_with_learner`; `robot_seconds_to_recover` (from the
shift to the acceptance of the first version at 0.9 of nominal offline) and
`rolled_back_version_ticks_max` (the most ticks any version later rolled back ran on the robot), beside
`worse_version_ticks_max` (the most ticks any version ran whose offline return was worse than the last
good version's by more than the trial's tolerated drop: a version rolled back undecided may be as good).
Prints a table, writes bench/results/finetune.json (pendulum's headline at the top level, as before;
every task's under `tasks.<task>` (the default method's, every method's figures under `methods`), and
`<task>_recovered_return_ratio` / `<task>_frozen_return_ratio` beside it, with the worst
`rolled_back_version_ticks_max`, `worse_version_ticks_max` and `tick_p99_ratio_with_learner` over the
tasks) and finetune.png (pendulum) or finetune_<task>.png (the default method's run), and prints the
headline JSON as its last line. About (1 + methods) x `--duration` + 60 s + 2 s per version.

Results: docs/results/finetuning.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from q2real.configs.loader import load
from q2real.contracts.transitions import RING, RUN, TransitionRing
from q2real.deploy_ros.session import deploy
from q2real.deploy_ros.settings import NodeConfig, RobotLearningSettings

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
PERIOD = 0.02


@dataclasses.dataclass(frozen=True)
class Bench:
    run_dir: Path
    shift: str
    """The sim robot's dynamics shift (`--shift`), also applied offline..."""
    shifted: dict
    """...as these randomization fields."""
    episode: float
    """Seconds between two resets of the sim robot: one episode of the task."""
    sim: tuple[str, ...]
    """More sim robot options: the reset spread, the task's commands."""
    title: str
    noise: tuple[float, float]
    """Exploration (std, bound) of the fine-tuned run, unless `--noise`."""
    trial: tuple[str, ...] = ()
    """The node's trial settings for the task, beside its defaults."""


TASKS = {
    "pendulum": Bench(
        ROOT / "tests" / "fixtures" / "pendulum_run",
        "actuator_gain_scale=0.5",
        {"actuator_gain_scale": (0.5, 0.5)},
        10.0,
        ("--reset-spread", "3.14159"),
        "pendulum on the sim robot: nominal bundle, then half the actuator gain (dashed)",
        (0.3, 0.5),
    ),
    "panda_reach": Bench(
        RESULTS / "finetune" / "panda_reach_run",
        "payload=8",
        {"payload": (8.0, 8.0)},
        2.0,
        ("--reset-spread", "0.1", "--task", "panda_reach", "--task-commands"),
        "panda_reach on the sim robot: rated payloads in training, then 8 kg on the wrist (dashed)",
        (0.1, 0.3),
        # A segment of one 2 s episode: in a quarter of one, a version's turn would be the reach or the
        # hold, and which it got would decide the pair.
        ("finetune.segment=100", "finetune.max_pairs=20"),
    ),
}


METHODS: dict[str, tuple[str, ...]] = {
    "free": ("anchor=0",),
    "anchored": ("anchor=5",),
    "anchored_20": ("anchor=20",),
}
"""How the learner fine-tunes (`--methods`, each a fine-tuned run beside the one frozen run), as its
settings: `free`, the actor follows its critic alone; `anchored` (`anchored_20`: a stronger pull), inside
a trust region around the last good version (`FinetuneConfig.anchor`)."""
DEFAULT_METHOD = "anchored_20"
"""The method the learner's defaults are; its figures are the task's headline."""


def run(
    bench: Bench,
    kind: str,
    duration: float,
    shift_at: float,
    root: Path,
    noise: tuple[float, float],
    learner: list[str],
) -> dict:
    directory, run_dir, episode = root / kind, bench.run_dir, bench.episode
    root.mkdir(parents=True, exist_ok=True)
    overrides = ["autostart=true"]
    if kind != "no learner":
        overrides += [f"finetune.run={run_dir}", f"finetune.directory={directory}"]
    if kind == "frozen":
        overrides += ["finetune.noise_std=0", "finetune.learner=[actor_start=1000000000]"]
    if kind == "fine-tuned":
        overrides += [f"finetune.noise_std={noise[0]}", f"finetune.noise_bound={noise[1]}", *bench.trial]
        overrides += [f"finetune.learner=[{','.join(learner)}]"] if learner else []
    config = load(NodeConfig, None, overrides)
    shift = ["--shift", bench.shift, "--shift-at", str(shift_at), "--reset-every", str(episode), *bench.sim]
    began = time.monotonic()
    summary = deploy(run_dir / "policy.onnx", config, sim=True, duration=duration, status_every=None, sim_extra=shift)
    row = {"kind": kind, "wall_s": time.monotonic() - began, "ticks": summary.ticks}
    row |= {"p50_ms": summary.latency_p50_ms, "p99_ms": summary.latency_p99_ms}
    row |= {
        "loop_misses": summary.loop_deadline_misses,
        "policy_misses": summary.shield_counters.get("DEADLINE_MISS", 0),
    }
    if kind == "no learner":
        return row
    ring = TransitionRing(directory / RING)
    rows, _ = ring.read(0)
    rewards, _, rewarded = ring.rewards_since(0)
    rows = rows[:rewarded]  # rows after the learner's last reward were never scored
    running = (rows["flags"] & RUN) > 0
    # Tick 0 of the ring is the first joint state, within a tick of the first command: the sim robot's
    # clock for its resets and the shift.
    seconds = (rows["tick"] - rows["tick"][0]) * PERIOD
    edges = np.arange(0.0, seconds.max(), episode)
    curve = []
    for start in edges:
        inside = running & (seconds >= start) & (seconds < start + episode) & np.isfinite(rewards)
        if inside.sum() > 0.8 * episode / PERIOD:
            curve.append((float(start), float(rewards[inside].mean() * episode / PERIOD)))
    row["curve"] = curve
    row["finetune"] = summary.finetune
    versions, ticks = np.unique(rows["version"][running], return_counts=True)
    row["ticks_by_version"] = {int(v): int(n) for v, n in zip(versions, ticks, strict=True)}
    return row


def window_return(curve: list[tuple[float, float]], start: float, end: float, episode: float) -> float:
    values = [r for t, r in curve if start <= t and t + episode <= end]
    return float(np.mean(values)) if values else float("nan")


def offline(bench: Bench, bundle: Path, shifted: bool, episodes: int = 32) -> float:
    """Mean return of `bundle` on 32 seeded episodes of the simulator: the run's env without its
    training randomization, nominal or with the bench's shift."""
    import torch

    from q2real.agents.callbacks import evaluate
    from q2real.agents.config import load_run_config
    from q2real.deploy_ros.bundle import PolicyBundle
    from q2real.sim import make
    from q2real.sim.randomization import RandomizationConfig

    config = load_run_config(bench.run_dir)
    dynamics = RandomizationConfig(**bench.shifted) if shifted else RandomizationConfig()
    env = make(dataclasses.replace(config.env, num_envs=episodes, device="cpu", seed=777, randomization=dynamics))
    runner = PolicyBundle(bundle)
    try:
        returns = evaluate(lambda obs: torch.from_numpy(runner.normalized(runner(obs.numpy()))), env, 777)
    finally:
        env.close()
    return float(returns.mean())


def version_returns(bench: Bench, row: dict, directory: Path) -> list[dict]:
    """Every version the node swapped in, with when (robot s), its verdict, its offline shifted return
    and whether that is worse than the last good version's when it went on trial (by more than the
    trial's tolerated drop, `RobotLearningSettings.return_drop`)."""
    events = row["finetune"]["events"]
    accepted_at = {e["version"]: e["tick"] * PERIOD for e in events if e["event"] == "accepted"}
    kept = set(accepted_at)
    rolled = {int(e["detail"].split(":")[0].split()[1]) for e in events if e["event"] == "rolled_back"}
    drop = RobotLearningSettings().return_drop
    good = offline(bench, directory / "v0000.onnx", True)
    found = []
    for event in events:
        if event["event"] != "swapped":
            continue
        version = event["version"]
        verdict = "kept" if version in kept else "rolled back" if version in rolled else "on trial at the end"
        bundle = directory / f"v{version:04d}.onnx"
        value = offline(bench, bundle, True)
        found.append(
            {
                "version": version,
                "seconds": event["tick"] * PERIOD,
                "verdict": verdict,
                "accepted_at": accepted_at.get(version),
                "ticks": row["ticks_by_version"].get(version, 0),
                "return": value,
                "worse": value < good - drop * abs(good),
            }
        )
        good = value if version in kept else good
    return found


def plot(bench: Bench, rows: dict[str, dict], shift_at: float, levels: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for kind, color in (("frozen", "tab:gray"), ("fine-tuned", "tab:blue")):
        t, r = zip(*rows[kind]["curve"], strict=True)
        top.plot(np.array(t) + bench.episode / 2, r, marker="o", ms=3, color=color, label=kind)
    top.set_ylabel(f"return per {bench.episode:g} s episode\n(on the robot, with noise)")
    top.set_title(bench.title)
    versions = rows["fine-tuned"]["versions"]
    for verdict, marker, color in (
        ("kept", "o", "tab:blue"),
        ("rolled back", "x", "tab:red"),
        ("on trial at the end", "^", "tab:orange"),
    ):
        chosen = [v for v in versions if v["verdict"] == verdict]
        if chosen:
            bottom.plot([v["seconds"] for v in chosen], [v["return"] for v in chosen], marker, color=color,
                        label=f"version swapped in, {verdict}")  # fmt: skip
    bottom.axhline(levels["nominal"], color="k", ls=":", lw=1, label="deployed bundle, nominal dynamics")
    bottom.axhline(levels["frozen"], color="tab:gray", lw=1, label="deployed bundle, shifted dynamics")
    bottom.set_ylabel("offline return, shifted\n(32 seeded episodes)")
    bottom.set_xlabel("robot time (s), 50 Hz")
    for ax, where in ((top, "lower left"), (bottom, "upper left")):
        ax.axvline(shift_at, color="tab:red", ls="--", lw=1)
        ax.grid(alpha=0.3)
        ax.legend(loc=where, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def figures(rows: dict[str, dict], tuned: dict, levels: dict[str, float], args) -> dict[str, float]:
    """One method's headline figures beside the frozen and no-learner runs."""
    versions, nominal = tuned["versions"], levels["nominal"]
    recovered = [v["accepted_at"] for v in versions if v["accepted_at"] is not None and v["return"] >= 0.9 * nominal]
    return {
        "recovered_return_ratio": levels["good"] / nominal,
        "frozen_return_ratio": levels["frozen"] / nominal,
        "best_version_return_ratio": max((v["return"] for v in versions), default=float("nan")) / nominal,
        "stream_tail_ratio_finetuned": tuned["tail_return"] / rows["frozen"]["pre_shift_return"],
        "stream_tail_ratio_frozen": rows["frozen"]["tail_return"] / rows["frozen"]["pre_shift_return"],
        "tick_p99_ratio_with_learner": tuned["p99_ms"] / rows["no learner"]["p99_ms"],
        "tick_p99_ms_with_learner": tuned["p99_ms"],
        "tick_p99_ms_without_learner": rows["no learner"]["p99_ms"],
        "loop_deadline_misses_with_learner": tuned["loop_misses"],
        "loop_deadline_miss_fraction_with_learner": tuned["loop_misses"] / tuned["ticks"],
        "robot_seconds_after_shift": args.duration - args.shift_at,
        "robot_seconds_to_recover": min(recovered, default=float("nan")) - args.shift_at,
        "rolled_back_version_ticks_max": max(
            (v["ticks"] for v in versions if v["verdict"] == "rolled back"), default=0
        ),
        "worse_version_ticks_max": max((v["ticks"] for v in versions if v["worse"]), default=0),
        "versions_swapped": tuned["finetune"]["swaps"],
        "rollbacks": tuned["finetune"]["rollbacks"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="pendulum")
    parser.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=[DEFAULT_METHOD])
    parser.add_argument("--duration", type=float, default=330.0, help="seconds per run (real time)")
    parser.add_argument("--shift-at", type=float, default=40.0, help="seconds after the first command")
    parser.add_argument("--tail", type=float, default=60.0, help="seconds at the end the stream return is taken")
    parser.add_argument("--noise", type=float, nargs=2, metavar=("STD", "BOUND"), help="default: the task's")
    args = parser.parse_args()
    stored = json.loads((RESULTS / "finetune.json").read_text()) if (RESULTS / "finetune.json").is_file() else {}
    if DEFAULT_METHOD not in args.methods and args.task not in stored.get("tasks", {}):
        parser.error(f"--methods: the first run of --task {args.task} includes {DEFAULT_METHOD}, its headline")
    bench, noise, end = TASKS[args.task], tuple(args.noise or TASKS[args.task].noise), args.duration
    rows: dict[str, dict] = {}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("no learner", "no learner", 60.0), ("frozen", "frozen", end)]
        runs += [(method, "fine-tuned", end) for method in args.methods]
        for name, kind, duration in runs:
            print(f"{args.task}, {name}: {duration:g} s on the sim robot ...", flush=True)
            rows[name] = run(bench, kind, duration, args.shift_at, Path(tmp) / name, noise, list(METHODS.get(name, ())))
        deployed = bench.run_dir / "policy.onnx"
        common = {"nominal": offline(bench, deployed, False), "frozen": offline(bench, deployed, True)}
        for name in ("frozen", *args.methods):
            curve = rows[name]["curve"]
            rows[name] |= {
                "pre_shift_return": window_return(curve, 0.0, args.shift_at, bench.episode),
                "tail_return": window_return(curve, end - args.tail, end, bench.episode),
            }
        for method in args.methods:
            tuned = rows[method]
            tuned["versions"] = version_returns(bench, tuned, Path(tmp) / method / "fine-tuned")
            good = Path(tmp) / method / "fine-tuned" / f"v{tuned['finetune']['good_version']:04d}.onnx"
            levels = common | {"good": offline(bench, good, True)}
            results[method] = figures(rows, tuned, levels, args) | {"levels": levels}
    print(f"\n{'run':<12}{'pre-shift':>11}{'last ' + str(int(args.tail)) + ' s':>10}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'misses':>8}   (returns per {bench.episode:g} s episode on the robot, noise included)")  # fmt: skip
    for name, row in rows.items():
        cells = f"{row['pre_shift_return']:>11.1f}{row['tail_return']:>10.1f}" if name != "no learner" else " " * 21
        print(f"{name:<12}{cells}{row['p50_ms']:>8.3f}{row['p99_ms']:>8.3f}{row['loop_misses']:>8}")
    levels = f"{common['nominal']:.1f} nominal, {common['frozen']:.1f} shifted"
    print(f"\noffline, 32 seeded episodes: deployed bundle {levels}")
    for method in args.methods:
        tuned, result = rows[method], results[method]
        finetune = tuned["finetune"]
        print(
            f"{method} ({' '.join(METHODS[method])}): last good version "
            f"v{finetune['good_version']} {result['levels']['good']:.1f} shifted, recovered "
            f"{result['recovered_return_ratio']:.3f} of nominal (frozen {result['frozen_return_ratio']:.3f}); "
            f"{finetune['swaps']} versions swapped in, {finetune['accepted']} accepted, {finetune['rollbacks']} "
            f"rolled back (longest {result['rolled_back_version_ticks_max']} ticks), {finetune['refused']} refused"
        )
        for v in tuned["versions"]:
            print(
                f"  v{v['version']:<4} swapped in at {v['seconds']:6.1f} s  {v['verdict']:<20} {v['ticks']:>6} ticks  "
                f"offline shifted {v['return']:.1f}"
            )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "finetune.json"
    merged = json.loads(path.read_text()) if path.is_file() else {}
    tasks = merged.pop("tasks", {})
    entry = tasks.get(args.task, {})
    methods = entry.get("methods", {}) | {m: {k: v for k, v in r.items() if k != "levels"} for m, r in results.items()}
    rewritten = DEFAULT_METHOD in results  # the task's figures, runs and plot are the default method's
    if rewritten:
        shown = {"no learner": rows["no learner"], "frozen": rows["frozen"], "fine-tuned": rows[DEFAULT_METHOD]}
        entry = results[DEFAULT_METHOD] | {"method": DEFAULT_METHOD, "runs": shown}
    tasks[args.task] = entry | {"methods": methods}
    headline = {k: v for k, v in tasks.get("pendulum", {}).items() if k not in ("levels", "runs", "methods", "method")}
    for task, result in tasks.items():
        if task != "pendulum":
            headline |= {f"{task}_{key}": result[key] for key in ("recovered_return_ratio", "frozen_return_ratio")}
    for key in ("rolled_back_version_ticks_max", "worse_version_ticks_max"):
        headline[key] = max((r[key] for r in tasks.values() if key in r), default=0)
    headline["tick_p99_ratio_with_learner"] = max(r["tick_p99_ratio_with_learner"] for r in tasks.values())
    path.write_text(json.dumps(headline | {"tasks": tasks}, indent=2))
    if rewritten:
        plot(
            bench,
            {"frozen": rows["frozen"], "fine-tuned": rows[DEFAULT_METHOD]},
            args.shift_at,
            results[DEFAULT_METHOD]["levels"],
            RESULTS / ("finetune.png" if args.task == "pendulum" else f"finetune_{args.task}.png"),
        )
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
