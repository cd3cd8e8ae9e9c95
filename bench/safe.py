"""SAC, SAC-Lagrangian and COX-Q under a cost constraint: final return, final episode cost and the cost
paid while learning.

Two tasks, each learner at the same budget, seeds and shared settings:
  hopper  `hopper_velocity`: gymnasium's Hopper-v5 with Safety-Gymnasium's velocity cost (1 per step
          above 0.7402 m/s), limit 25 per 1000-step episode (OmniSafe's benchmark)
  reach   `panda_reach` with a 20 x 20 x 10 cm keep-out box above the home pose (1 per step inside),
          limit 5 per 100-step episode
Every learner shares SAC's settings (networks, learning rates, batch, envs, one update per vectorized
step, warm-up); SAC-Lag and COX-Q share the cost limit and the multiplier's rule. COX-Q runs its own
pieces at its paper's settings but for 8 quantiles per critic instead of 32 (32 x 160 atoms per sample
ran at a third of the speed on 2 cores). `training cost` is every step's cost summed over all envs
from the first step (the random warm-up included; it is the same for all three learners).

OmniSafe's published SAC-Lag at 1M env steps, quoted for scale (our budget is far smaller):
SafetyHopperVelocity 963 return / 20.2 episode cost; SafetyAntVelocity 1897 / 5.7.

Headline keys (hopper): `coxq_training_cost_ratio` (SAC-Lag's training cost / COX-Q's) and
`coxq_return_ratio` (COX-Q's final return / SAC-Lag's); the same for reach with a `_reach` suffix.
Runs go two at a time, one torch thread each. Prints a table, writes bench/results/safe.json (with the
curves) and safe.png, and prints the JSON without the curves as its last line.

Results: docs/results/learners.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
LEARNERS = ("sac", "sac_lag", "coxq")
TASKS = {
    "hopper": {
        "overrides": ["env.task=hopper_velocity"],
        "limit": 25.0,
        "horizon": 1000,
    },
    "reach": {
        "overrides": [
            "env.task=panda_reach",
            "env.task_params.keepout_low=[0.35,-0.1,0.28]",
            "env.task_params.keepout_high=[0.55,0.1,0.38]",
        ],
        "limit": 5.0,
        "horizon": 100,
    },
}
SHARED = [
    "env.num_envs=4",
    "warmup_steps=5000",
    "threads=1",
    "eval_envs=10",
    "checkpoint_every=0",
    "log.tensorboard=false",
]


def learner_overrides(algo: str, task: dict) -> list[str]:
    out = [f"algo={algo}", f"{algo}.actor_hidden=[256,256]", f"{algo}.critic_hidden=[256,256]"]
    if algo != "sac":
        out += [f"{algo}.cost_limit={task['limit']}", f"{algo}.limit_horizon={task['horizon']}"]
    if algo == "coxq":
        out += ["coxq.num_quantiles=8"]
    return out


def run_one(job: tuple[str, str, int, int, int, str]) -> dict:
    """One training run in a worker process; its curves and final figures."""
    import torch

    from q2real.agents.config import TrainConfig
    from q2real.agents.train import Trainer
    from q2real.configs.loader import load

    task_name, algo, seed, steps, eval_every, root = job
    torch.set_num_threads(1)
    task = TASKS[task_name]
    overrides = [*task["overrides"], *SHARED, *learner_overrides(algo, task), f"env.seed={seed}"]
    overrides += [f"total_steps={steps}", f"eval_every={eval_every}", f"log.root={root}"]
    overrides += [f"log.name={task_name}-{algo}-{seed}", f"log.interval_steps={max(steps // 30, 1000)}"]
    start = time.monotonic()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):  # two progress bars would interleave
        trainer = Trainer(load(TrainConfig, None, overrides))
        trainer.run()
    records = [json.loads(line) for line in (trainer.path / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval_return"], r["eval_cost"]) for r in records if "eval_return" in r]
    paid = [(r["step"], r["training_cost"]) for r in records if "training_cost" in r]
    return {
        "task": task_name,
        "algo": algo,
        "seed": seed,
        "return": trainer.last_eval,
        "cost": trainer.last_eval_cost,
        "training_cost": paid[-1][1] if paid else 0.0,
        "evals": evals,
        "training_costs": paid,
        "seconds": time.monotonic() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--hopper-steps", type=int, default=60_000)
    parser.add_argument("--reach-steps", type=int, default=30_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    steps = {"hopper": args.hopper_steps, "reach": args.reach_steps}
    with tempfile.TemporaryDirectory() as root:
        jobs = [
            (task, algo, seed, steps[task], max(steps[task] // 6, 1), root)
            for task in args.tasks
            for seed in range(args.seeds)
            for algo in ("coxq", "sac_lag", "sac")  # the slowest first, so the pool drains evenly
        ]
        with mp.get_context("spawn").Pool(args.workers) as pool:
            runs = []
            for run in pool.imap_unordered(run_one, jobs):
                runs.append(run)
                print(
                    f"  {run['task']:6s} {run['algo']:8s} seed {run['seed']}: return {run['return']:8.1f}  "
                    f"cost {run['cost']:6.1f}  training cost {run['training_cost']:9.0f}  ({run['seconds']:.0f} s)",
                    flush=True,
                )
    headline = report(runs, args, steps)
    plot(runs, args)
    print(json.dumps({k: v for k, v in headline.items() if k != "runs"}))


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def report(runs: list[dict], args: argparse.Namespace, steps: dict[str, int]) -> dict:
    summary: dict[str, dict[str, dict[str, float]]] = {}
    print(f"\n{'task':7s} {'learner':8s} {'return':>9s} {'ep. cost':>9s} {'training cost':>14s} {'s/run':>6s}")
    for task in args.tasks:
        summary[task] = {}
        for algo in LEARNERS:
            mine = [r for r in runs if r["task"] == task and r["algo"] == algo]
            row = {key: _mean([r[key] for r in mine]) for key in ("return", "cost", "training_cost", "seconds")}
            row["return_std"] = statistics.stdev([r["return"] for r in mine]) if len(mine) > 1 else 0.0
            summary[task][algo] = row
            print(
                f"{task:7s} {algo:8s} {row['return']:9.1f} {row['cost']:9.1f} {row['training_cost']:14.0f} "
                f"{row['seconds']:6.0f}"
            )
        print(f"        (limit {TASKS[task]['limit']} per episode, {steps[task]} env steps, {args.seeds} seeds)")
    headline: dict = {}
    for task in args.tasks:
        suffix = "" if task == "hopper" else f"_{task}"
        lag, coxq = summary[task]["sac_lag"], summary[task]["coxq"]
        headline[f"coxq_training_cost_ratio{suffix}"] = lag["training_cost"] / max(coxq["training_cost"], 1e-9)
        headline[f"coxq_return_ratio{suffix}"] = coxq["return"] / lag["return"] if lag["return"] else float("nan")
    headline |= {"steps": steps, "seeds": args.seeds, "summary": summary, "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "safe.json").write_text(json.dumps(headline, indent=2) + "\n")
    return headline


def plot(runs: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(args.tasks), 3, figsize=(14, 3.6 * len(args.tasks)), squeeze=False)
    for row, task in enumerate(args.tasks):
        for algo in LEARNERS:
            mine = [r for r in runs if r["task"] == task and r["algo"] == algo]
            for column, key in ((0, 1), (1, 2)):
                for r in mine:
                    xs = [e[0] for e in r["evals"]]
                    axes[row][column].plot(
                        xs,
                        [e[key] for e in r["evals"]],
                        color=f"C{LEARNERS.index(algo)}",
                        alpha=0.6,
                        label=algo if r["seed"] == 0 else None,
                    )
            for r in mine:
                xs = [p[0] for p in r["training_costs"]]
                axes[row][2].plot(
                    xs,
                    [p[1] for p in r["training_costs"]],
                    color=f"C{LEARNERS.index(algo)}",
                    alpha=0.6,
                    label=algo if r["seed"] == 0 else None,
                )
        axes[row][1].axhline(TASKS[task]["limit"], color="k", linestyle="--", linewidth=1, label="limit")
        for column, title in enumerate(("evaluation return", "evaluation episode cost", "training cost paid")):
            axes[row][column].set_title(f"{task}: {title}")
            axes[row][column].set_xlabel("env steps")
            axes[row][column].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "safe.png", dpi=110)


if __name__ == "__main__":
    main()
