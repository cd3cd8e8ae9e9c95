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
  the joint states, the target from the observation (`q2real.sim.streamed`).

Each is deployed with `q2real deploy --sim` on the sim robot, in real time over DDS loopback
(50 Hz). Three runs of the same length:

  frozen      the bundle as deployed, no noise; the learner process runs but never moves the actor
              (it only scores the ticks: the reward is computed the same way in both runs)
  fine-tuned  `--finetune`: noise 0.3 bounded 0.5 for pendulum, the node's default 0.1 / 0.3 for the
              arm (`--noise`), the rest at its defaults: a version every 5 s once the actor moves
              (after 3000 transitions), each on trial in turns with the last good version
  no learner  plain deploy, for the node's tick latency without a learner beside it (shorter)

On the robot, return is the mean reward per tick over one episode's window (10 s, 2 s) times its
ticks, with the exploration noise in it. Every version the node swapped in is also evaluated offline, without
noise, on 32 seeded episodes of the shifted simulator. Headline keys: `recovered_return_ratio` (the
node's last good version, offline on the shifted dynamics ÷ the deployed bundle offline on nominal
dynamics: the pre-shift level), beside `frozen_return_ratio` (the deployed bundle on the shifted
dynamics ÷ the same), and `tick_p99_ratio_with_learner` (the fine-tuned run's tick latency p99 ÷ the
no-learner run's), with `loop_deadline_miss_fraction_with_learner`.
Prints a table, writes bench/results/finetune.json (pendulum's headline at the top level, as before;
every task's under `tasks.<task>`, and `<task>_recovered_return_ratio` / `<task>_frozen_return_ratio`
beside it) and finetune.png (pendulum) or finetune_<task>.png, and prints the headline JSON as its
last line. About 2 x `--duration` + 60 s + 2 s per version.

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
from q2real.deploy_ros.settings import NodeConfig

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
    ),
}


def run(bench: Bench, kind: str, duration: float, shift_at: float, root: Path, noise: tuple[float, float]) -> dict:
    directory, run_dir, episode = root / kind, bench.run_dir, bench.episode
    overrides = ["autostart=true"]
    if kind != "no learner":
        overrides += [f"finetune.run={run_dir}", f"finetune.directory={directory}"]
    if kind == "frozen":
        overrides += ["finetune.noise_std=0", "finetune.learner=[actor_start=1000000000]"]
    if kind == "fine-tuned":
        overrides += [f"finetune.noise_std={noise[0]}", f"finetune.noise_bound={noise[1]}"]
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
    """Every version the node swapped in, with when (robot s), its verdict and its offline shifted return."""
    events = row["finetune"]["events"]
    kept = {e["version"] for e in events if e["event"] == "accepted"}
    rolled = {int(e["detail"].split(":")[0].split()[1]) for e in events if e["event"] == "rolled_back"}
    found = []
    for event in events:
        if event["event"] != "swapped":
            continue
        version = event["version"]
        verdict = "kept" if version in kept else "rolled back" if version in rolled else "on trial at the end"
        bundle = directory / f"v{version:04d}.onnx"
        found.append(
            {
                "version": version,
                "seconds": event["tick"] * PERIOD,
                "verdict": verdict,
                "return": offline(bench, bundle, True),
            }
        )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="pendulum")
    parser.add_argument("--duration", type=float, default=330.0, help="seconds per run (real time)")
    parser.add_argument("--shift-at", type=float, default=40.0, help="seconds after the first command")
    parser.add_argument("--tail", type=float, default=60.0, help="seconds at the end the stream return is taken")
    parser.add_argument("--noise", type=float, nargs=2, metavar=("STD", "BOUND"), help="default: the task's")
    args = parser.parse_args()
    bench = TASKS[args.task]
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, duration in (("no learner", 60.0), ("frozen", args.duration), ("fine-tuned", args.duration)):
            print(f"{args.task}, {kind}: {duration:g} s on the sim robot ...", flush=True)
            rows[kind] = run(bench, kind, duration, args.shift_at, Path(tmp), tuple(args.noise or bench.noise))
        tuned = rows["fine-tuned"]
        tuned["versions"] = version_returns(bench, tuned, Path(tmp) / "fine-tuned")
        good = Path(tmp) / "fine-tuned" / f"v{tuned['finetune']['good_version']:04d}.onnx"
        deployed = bench.run_dir / "policy.onnx"
        levels = {
            "nominal": offline(bench, deployed, False),
            "frozen": offline(bench, deployed, True),
            "good": offline(bench, good, True),
        }
    end = args.duration
    for kind in ("frozen", "fine-tuned"):
        curve = rows[kind]["curve"]
        # The first window holds the ramp to the default pose and is left out.
        rows[kind] |= {
            "pre_shift_return": window_return(curve, 0.0, args.shift_at, bench.episode),
            "tail_return": window_return(curve, end - args.tail, end, bench.episode),
        }
    finetune = tuned["finetune"]
    print(f"\n{'run':<12}{'pre-shift':>11}{'last ' + str(int(args.tail)) + ' s':>10}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'misses':>8}   (returns per {bench.episode:g} s episode on the robot, noise included)")  # fmt: skip
    for kind, row in rows.items():
        cells = f"{row['pre_shift_return']:>11.1f}{row['tail_return']:>10.1f}" if kind != "no learner" else " " * 21
        print(f"{kind:<12}{cells}{row['p50_ms']:>8.3f}{row['p99_ms']:>8.3f}{row['loop_misses']:>8}")
    good_version = finetune["good_version"]
    print(
        f"\noffline, 32 seeded episodes: deployed bundle {levels['nominal']:.1f} nominal, {levels['frozen']:.1f} "
        f"shifted; the node's last good version (v{good_version}) {levels['good']:.1f} shifted"
    )
    for v in tuned["versions"]:
        print(
            f"  v{v['version']:<4} swapped in at {v['seconds']:6.1f} s  {v['verdict']:<12} "
            f"offline shifted {v['return']:.1f}"
        )
    print(
        f"fine-tuning: {finetune['swaps']} versions swapped in, {finetune['accepted']} accepted, "
        f"{finetune['rollbacks']} rolled back, {finetune['refused']} refused; robot time after the shift "
        f"{end - args.shift_at:g} s"
    )
    figures = {
        "recovered_return_ratio": levels["good"] / levels["nominal"],
        "frozen_return_ratio": levels["frozen"] / levels["nominal"],
        "best_version_return_ratio": max((v["return"] for v in tuned["versions"]), default=float("nan"))
        / levels["nominal"],
        "stream_tail_ratio_finetuned": rows["fine-tuned"]["tail_return"] / rows["frozen"]["pre_shift_return"],
        "stream_tail_ratio_frozen": rows["frozen"]["tail_return"] / rows["frozen"]["pre_shift_return"],
        "tick_p99_ratio_with_learner": rows["fine-tuned"]["p99_ms"] / rows["no learner"]["p99_ms"],
        "tick_p99_ms_with_learner": rows["fine-tuned"]["p99_ms"],
        "tick_p99_ms_without_learner": rows["no learner"]["p99_ms"],
        "loop_deadline_misses_with_learner": rows["fine-tuned"]["loop_misses"],
        "loop_deadline_miss_fraction_with_learner": rows["fine-tuned"]["loop_misses"] / rows["fine-tuned"]["ticks"],
        "robot_seconds_after_shift": end - args.shift_at,
        "versions_swapped": finetune["swaps"],
        "rollbacks": finetune["rollbacks"],
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "finetune.json"
    merged = json.loads(path.read_text()) if path.is_file() else {}
    tasks = merged.pop("tasks", {})
    if not tasks and "levels" in merged:  # written before the bench took --task: pendulum's
        tasks["pendulum"] = merged
    tasks[args.task] = figures | {"levels": levels, "runs": rows}
    headline = {k: v for k, v in tasks.get("pendulum", {}).items() if k not in ("levels", "runs")}
    for task, result in tasks.items():
        if task != "pendulum":
            headline |= {f"{task}_{key}": result[key] for key in ("recovered_return_ratio", "frozen_return_ratio")}
    path.write_text(json.dumps(headline | {"tasks": tasks}, indent=2))
    plot(
        bench,
        rows,
        args.shift_at,
        levels,
        RESULTS / ("finetune.png" if args.task == "pendulum" else f"finetune_{args.task}.png"),
    )
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
