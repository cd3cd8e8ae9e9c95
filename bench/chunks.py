"""Action-chunk critics against n-step SAC on sparse tasks: return and success vs env steps.

Four learners, all SAC with the same networks, learning rates, batch, update ratio, envs and seeds,
one after the other in this invocation, at equal env steps:
  sac    per-step SAC with n-step returns, n = h (the fair baseline: the same backup length)
  qc     Q-chunking: chunks of h actions executed open loop, critic over the chunk, h-step backup
  dqc    decoupled: critic over h actions, policy over the first h / 2, distilled prefix critic
  multi  multi-horizon causal-transformer critic, chunks of h, replanning every h / 2 ticks
Every `--eval-every` env steps each run is evaluated deterministically on `--eval-episodes` seeded
episodes (its chunks executed as the robot executes them). On these tasks the reward is 1 per step
at the goal, so an episode's return counts its steps there and success means a return above 0.

Headline keys: `qc_over_sac_return` and `qc_over_sac_success` (QC's mean final evaluation over
seeds / SAC's, on the first task), `env_steps_to_threshold_ratio` (per task: SAC's env steps to the
first evaluation whose mean over seeds reaches the task's threshold (`THRESHOLDS`), over the fastest chunked
learner's; a learner that never does counts the budget, which makes the ratio a bound; null when none
does) and `best_chunked_over_sac` (the best chunked learner's final return over SAC's, per task).
Prints a table, writes bench/results/chunks.json (with the curves) and chunks.png, and prints the
JSON without the curves as its last line.

Results: docs/results/learners.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from q2real.agents.callbacks import Callback, Every, deterministic_policy, evaluate
from q2real.agents.config import TrainConfig
from q2real.agents.train import Trainer
from q2real.configs.loader import load

RESULTS = Path(__file__).resolve().parent / "results"
TASKS = {
    "cartpole": [
        "env.task=cartpole_swingup",
        "env.task_params.sparse=true",
        "env.task_params.episode_length=500",
    ],
    "push": ["env.task=panda_push", "env.task_params.sparse=true"],
}
STEPS = {"cartpole": 40_000, "push": 20_000}
"""Default env steps per run: what 2 CPU cores afford for 4 learners x 3 seeds."""
THRESHOLDS = {"cartpole": 25.0, "push": 10.0}
"""Mean evaluation return that counts as learning: over twice what uniform-random actions earn on
sparse cartpole (11.3 over 32 episodes: random starts pass the top) and 10 of 200 steps at the
target on push, where random and zero actions earn 0."""


def learners(h: int) -> dict[str, list[str]]:
    return {
        "sac": [f"sac.n_step={h}"],
        "qc": [f"sac.chunk.size={h}"],
        "dqc": [f"sac.chunk.size={h}", "sac.chunk.critic=dqc", f"sac.chunk.policy_size={h // 2}"],
        # One 32-wide layer: the default 2 x 64 transformer costs ~4x more per update on a CPU core.
        "multi": [
            f"sac.chunk.size={h}",
            "sac.chunk.critic=multi",
            f"sac.chunk.execute={h // 2}",
            "sac.chunk.width=32",
            "sac.chunk.layers=1",
            "sac.chunk.heads=2",
        ],
    }


class Curve(Callback):
    """Deterministic evaluation returns every `interval` env steps, on episodes seeded apart from training."""

    def __init__(self, interval: int, seed: int):
        self.interval, self.seed = interval, seed
        self.points: list[tuple[int, list[float]]] = []

    def on_start(self, trainer: Trainer) -> None:
        self.schedule = Every(self.interval, trainer.step)

    def on_iteration(self, trainer: Trainer) -> None:
        if self.schedule.due(trainer.step):
            policy = deterministic_policy(trainer.agent, trainer.eval_env)
            returns = evaluate(policy, trainer.eval_env, self.seed)
            self.points.append((trainer.step, returns.tolist()))


def run(task: str, name: str, extra: list[str], seed: int, args: argparse.Namespace, root: str) -> dict:
    overrides = [
        *TASKS[task],
        f"env.num_envs={args.envs}",
        f"env.seed={seed}",
        f"total_steps={args.steps or STEPS[task]}",
        f"warmup_steps={args.warmup}",
        "eval_every=0",
        f"eval_envs={args.eval_episodes}",
        "checkpoint_every=0",
        f"threads={args.threads}",
        f"sac.actor_hidden=[{args.hidden},{args.hidden}]",
        f"sac.critic_hidden=[{args.hidden},{args.hidden}]",
        f"log.root={root}",
        f"log.name={task}-{name}-{seed}",
        "log.tensorboard=false",
        f"log.interval_steps={args.eval_every}",
        *extra,
    ]
    curve = Curve(args.eval_every, 50_000 + seed)
    start = time.monotonic()
    trainer = Trainer(load(TrainConfig, None, overrides), callbacks=[curve])
    trainer.run()
    return {"points": curve.points, "wall_s": time.monotonic() - start}


def steps_to(points: list[tuple[int, float]], threshold: float) -> int | None:
    """Env steps at the first evaluation reaching `threshold`; None if none did."""
    return next((step for step, value in points if value >= threshold), None)


def threshold_ratio(sac: int | None, chunked: list[int | None], budget: int) -> float | None:
    """SAC's env steps to threshold over the fastest chunked learner's; a learner that never reached it
    counts the budget (so the ratio is a bound), and None when no learner reached it."""
    reached = [steps for steps in chunked if steps is not None]
    if sac is None and not reached:
        return None
    return _ratio(sac if sac is not None else budget, min(reached) if reached else budget)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="*", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--chunk", type=int, default=4, help="h: chunk length and n-step length")
    parser.add_argument("--steps", type=int, default=0, help="env steps per run (0: each task's `STEPS`)")
    parser.add_argument("--warmup", type=int, default=4_000)
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--eval-episodes", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--hidden", type=int, default=128, help="actor and critic MLP width (2 layers)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 leaves a core to the sim)")
    parser.add_argument("--rescore", action="store_true", help="recompute the headline from the saved curves")
    args = parser.parse_args()
    if args.rescore:
        print(json.dumps({k: v for k, v in rescore().items() if k != "curves"}))
        return
    names = learners(args.chunk)
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory() as root:
        for task in args.tasks:
            results[task] = {}
            for name, extra in names.items():
                results[task][name] = []
                for seed in args.seeds:
                    outcome = run(task, name, extra, seed, args, root)
                    results[task][name].append(outcome)
                    final = statistics.fmean(outcome["points"][-1][1])
                    print(
                        f"{task} {name} seed {seed}: final return {final:.1f} ({outcome['wall_s']:.0f} s)", flush=True
                    )
            headline = report(results, args)  # after every task: a long run that stops early keeps what it measured
    print(json.dumps({k: v for k, v in headline.items() if k != "curves"}))


def report(results: dict, args: argparse.Namespace) -> dict:
    """Table, plot and JSON of the tasks finished so far; returns the headline document."""
    names = learners(args.chunk)
    summary = summarize(results, args)
    table(summary, args)
    plot(summary, len(args.seeds))
    first = next(iter(summary))
    sac, qc = summary[first]["sac"], summary[first]["qc"]
    chunked = [n for n in names if n != "sac"]
    headline = {
        "qc_over_sac_return": _ratio(qc["final_return"], sac["final_return"]),
        "qc_over_sac_success": _ratio(qc["final_success"], sac["final_success"]),
        "env_steps_to_threshold_ratio": {
            task: threshold_ratio(
                rows["sac"]["steps_to_threshold"],
                [rows[n]["steps_to_threshold"] for n in chunked],
                args.steps or STEPS[task],
            )
            for task, rows in summary.items()
        },
        "best_chunked_over_sac": {
            task: _ratio(max(rows[n]["final_return"] for n in chunked), rows["sac"]["final_return"])
            for task, rows in summary.items()
        },
        "chunk": args.chunk,
        "env_steps": {task: args.steps or STEPS[task] for task in summary},
        "envs": args.envs,
        "hidden": args.hidden,
        "seeds": args.seeds,
        "thresholds": {task: THRESHOLDS[task] for task in summary},
        "learners": {
            task: {name: {k: v for k, v in row.items() if k != "curve"} for name, row in rows.items()}
            for task, rows in summary.items()
        },
        "curves": {task: {name: row["curve"] for name, row in rows.items()} for task, rows in summary.items()},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "chunks.json").write_text(json.dumps(headline, indent=2) + "\n")
    return headline


def rescore() -> dict:
    """The saved run's headline and plot with steps to threshold recomputed from its mean curves at
    `THRESHOLDS` (the other figures are those measured)."""
    saved = json.loads((RESULTS / "chunks.json").read_text())
    ratios = {}
    for task, curves in saved["curves"].items():
        for name, curve in curves.items():
            points = list(zip(curve["steps"], curve["return"], strict=True))
            saved["learners"][task][name]["steps_to_threshold"] = steps_to(points, THRESHOLDS[task])
        rows = saved["learners"][task]
        chunked = [rows[n]["steps_to_threshold"] for n in rows if n != "sac"]
        ratios[task] = threshold_ratio(rows["sac"]["steps_to_threshold"], chunked, saved["env_steps"][task])
    saved["env_steps_to_threshold_ratio"] = ratios
    saved["thresholds"] = {task: THRESHOLDS[task] for task in saved["curves"]}
    plot(
        {task: {n: {"curve": c} for n, c in curves.items()} for task, curves in saved["curves"].items()},
        len(saved["seeds"]),
    )
    (RESULTS / "chunks.json").write_text(json.dumps(saved, indent=2) + "\n")
    return saved


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > 0 else None


def summarize(results: dict, args: argparse.Namespace) -> dict:
    """Per task and learner: the mean curve over seeds, the final evaluation, env steps to threshold."""
    summary: dict[str, dict[str, dict]] = {}
    for task, rows in results.items():
        summary[task] = {}
        for name, runs in rows.items():
            steps = [step for step, _ in runs[0]["points"]]
            mean_return = [
                statistics.fmean(statistics.fmean(r["points"][i][1]) for r in runs) for i in range(len(steps))
            ]
            success = [
                statistics.fmean(statistics.fmean(v > 0 for v in r["points"][i][1]) for r in runs)
                for i in range(len(steps))
            ]
            finals = [statistics.fmean(r["points"][-1][1]) for r in runs]
            summary[task][name] = {
                "final_return": round(mean_return[-1], 2),
                "final_return_std_over_seeds": round(statistics.pstdev(finals), 2),
                "final_success": round(success[-1], 3),
                "steps_to_threshold": steps_to(list(zip(steps, mean_return, strict=True)), THRESHOLDS[task]),
                "wall_s_per_run": round(statistics.fmean(r["wall_s"] for r in runs), 1),
                "curve": {"steps": steps, "return": mean_return, "success": success},
            }
    return summary


def table(summary: dict, args: argparse.Namespace) -> None:
    budgets = ", ".join(f"{task} {args.steps or STEPS[task]}" for task in summary)
    print(f"\nh = {args.chunk}; env steps: {budgets}; {args.envs} envs, seeds {args.seeds}, SAC everywhere")
    print(
        f"{'task':<9} {'learner':<6} {'final return':>12} {'± seeds':>8} {'success':>8} "
        f"{'steps to thr':>12} {'s/run':>6}"
    )
    for task, rows in summary.items():
        for name, row in rows.items():
            print(
                f"{task:<9} {name:<6} {row['final_return']:>12.1f} {row['final_return_std_over_seeds']:>8.1f} "
                f"{row['final_success']:>8.2f} {row['steps_to_threshold'] or 'never':>12} {row['wall_s_per_run']:>6.0f}"
            )


def plot(summary: dict, seeds: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(summary), figsize=(5.5 * len(summary), 7), squeeze=False)
    for column, (task, rows) in enumerate(summary.items()):
        for name, row in rows.items():
            curve = row["curve"]
            axes[0, column].plot(curve["steps"], curve["return"], label=name)
            axes[1, column].plot(curve["steps"], curve["success"], label=name)
        axes[0, column].axhline(THRESHOLDS[task], color="grey", linestyle=":", linewidth=1)
        axes[0, column].set_title(f"sparse {task}: evaluation return (mean of {seeds} seeds)")
        axes[1, column].set_title("success rate")
        axes[1, column].set_xlabel("env steps")
        axes[0, column].legend()
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    fig.savefig(RESULTS / "chunks.png", dpi=110)


if __name__ == "__main__":
    main()
