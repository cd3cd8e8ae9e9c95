"""Residual RL on a BC base against BC alone, RLPD from scratch and SAC from scratch, sparse reward.

One invocation, one task (default: `panda_push` with its sparse reward, 1 per step while the cube is
within 5 cm of the target): the scripted expert records `--demos` episodes once; then, per seed,
  bc        behaviour cloning on the successful ones (evaluated once: it collects no env steps)
  residual  residual SAC on that seed's BC base, the same demonstrations in half of every batch
  rlpd      SAC with the same demonstrations in half of every batch, no base (RLPD from scratch)
  sac       SAC from scratch, online data only
The three RL learners share every SAC setting (LayerNorm networks, widths, learning rates, batch,
critics, one update per vectorized step, envs) and the budget; each is evaluated every
`--eval-every` env steps on `--eval-episodes` seeded episodes (success = the cube was ever there).

Headline keys: `residual_success`, `bc_success`, `scratch_success` (SAC from scratch), `rlpd_success`
(means over seeds at the budget) and `residual_over_bc`. Prints a table, writes
bench/results/residual.json (with the curves) and residual.png, and prints the JSON without the
curves as its last line.

Results: docs/results/learners.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from q2real.agents.common.run_dir import LogConfig
from q2real.agents.config import TrainConfig
from q2real.agents.train import Trainer
from q2real.configs.loader import load
from q2real.residual.bc import BCConfig, BCRun
from q2real.residual.dataset import write_lerobot
from q2real.residual.experts import make_expert
from q2real.residual.record import record
from q2real.residual.train import ResidualTrainConfig, ResidualTrainer
from q2real.sim import EnvConfig, make

RESULTS = Path(__file__).resolve().parent / "results"
TASKS = {
    "push": ["env.task=panda_push", "env.task_params.sparse=true"],
    "reach": ["env.task=panda_reach", "env.task_params.sparse=true"],
}
SAC = [
    "sac.network=layernorm",
    "sac.actor_hidden=[256,256]",
    "sac.critic_hidden=[256,256]",
    "sac.num_critics=5",
    "sac.target_subset=2",
    "sac.actor_uses_mean_q=true",
    "env.num_envs=4",
    "warmup_steps=1000",
    "threads=1",
    "log.tensorboard=false",
    "checkpoint_every=0",
]
"""Every RL learner's settings: RLPD's LayerNorm critic ensemble (5 members here, RLPD's 10 cost twice
as much on 2 cores) bootstrapped from a random pair, its mean-Q actor, 4 envs, UTD 0.25."""
RESIDUAL = ["sac.actor_lr=1e-6", "sac.critic_lr=1e-4", "residual.critic_warmup=1000"]
"""ResFiT's learning rates for the residual (a tiny actor step: it corrects a policy that works); RLPD
and SAC keep SAC's 3e-4, their own published setting."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="push")
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per RL run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--demos", type=int, default=100, help="expert episodes recorded (all; BC keeps successes)")
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--scale", type=float, default=0.1, help="the residual's bound alpha")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="q2real-residual-bench-"))
    overrides = TASKS[args.task]
    env_config = load(ResidualTrainConfig, None, overrides).env
    started = time.monotonic()
    demos_dir, expert_rate = record_demos(dataclasses.replace(env_config, num_envs=8), args.demos, root / "demos")
    print(f"expert: {expert_rate:.0%} success over the recorded episodes ({time.monotonic() - started:.0f} s)")
    common = [*overrides, *SAC, f"total_steps={args.steps}", f"eval_every={args.eval_every}"]
    common += [f"eval_envs={args.eval_episodes}", f"log.root={root}"]
    runs: dict[str, list[dict]] = {"bc": [], "residual": [], "rlpd": [], "sac": []}
    for seed in range(args.seeds):
        seeded = [*common, f"env.seed={seed}"]
        bc = BCRun(
            BCConfig(
                dataset=str(demos_dir),
                env=dataclasses.replace(env_config, seed=seed),
                eval_episodes=args.eval_episodes,
                seed=seed,
                log=LogConfig(root=str(root), name=f"bc-{seed}", tensorboard=False),
            )
        )
        t = time.monotonic()
        bc.run()
        runs["bc"].append(
            {"seed": seed, "success": bc.eval_success, "return": bc.eval_return, "seconds": time.monotonic() - t}
        )
        print(f"seed {seed} bc: success {bc.eval_success:.2f}, return {bc.eval_return:.1f}")
        demo = [f"residual.demos={demos_dir}"]
        jobs = {
            "residual": [*demo, *RESIDUAL, f"residual.base={bc.path}", f"residual.scale={args.scale}"],
            "rlpd": demo,
            "sac": [],
        }
        for name, extra in jobs.items():
            outcome = train_one(name, [*seeded, *extra, f"log.name={name}-{seed}"])
            runs[name].append(outcome | {"seed": seed})
            print(f"seed {seed} {name}: final success {outcome['success']:.2f}, {outcome['seconds']:.0f} s")
        report(runs, args, expert_rate)  # after every seed: a long run that stops early keeps what it measured
    headline = report(runs, args, expert_rate)
    print(json.dumps({k: v for k, v in headline.items() if k != "curves"}))


def record_demos(env_config: EnvConfig, episodes: int, out: Path) -> tuple[Path, float]:
    env = make(env_config)
    try:
        expert = make_expert(env_config.task, env)
        recorded = record(env, expert, episodes, env_config, "scripted expert", expert.reset, seed=1234)
    finally:
        env.close()
    return write_lerobot(recorded.demos, out), recorded.success_rate


def train_one(name: str, overrides: list[str]) -> dict:
    t = time.monotonic()
    if name == "sac":
        trainer: Trainer = Trainer(load(TrainConfig, None, overrides))
    else:
        trainer = ResidualTrainer(load(ResidualTrainConfig, None, overrides))
    trainer.run()
    records = [json.loads(line) for line in (trainer.path / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["eval_success"], r["eval_return"]) for r in records if "eval_success" in r]
    return {"success": curve[-1][1], "return": curve[-1][2], "curve": curve, "seconds": time.monotonic() - t}


def report(runs: dict[str, list[dict]], args: argparse.Namespace, expert_rate: float) -> dict:
    def mean(name: str, key: str) -> float | None:
        values = [r[key] for r in runs[name] if r.get(key) is not None]
        return statistics.fmean(values) if values else None

    def spread(name: str, key: str) -> float | None:
        values = [r[key] for r in runs[name] if r.get(key) is not None]
        return statistics.pstdev(values) if len(values) > 1 else None

    bc, residual = mean("bc", "success"), mean("residual", "success")
    headline = {
        "task": args.task,
        "budget_env_steps": args.steps,
        "seeds": len(runs["residual"]),
        "expert_success": expert_rate,
        "residual_success": residual,
        "bc_success": bc,
        "scratch_success": mean("sac", "success"),
        "rlpd_success": mean("rlpd", "success"),
        "residual_over_bc": residual / bc if residual is not None and bc else None,
        "table": {
            name: {
                "success": mean(name, "success"),
                "success_std": spread(name, "success"),
                "return": mean(name, "return"),
                "seconds_per_run": mean(name, "seconds"),
            }
            for name in runs
        },
        "settings": {
            "sac": SAC,
            "residual": RESIDUAL,
            "scale": args.scale,
            "demos": args.demos,
            "eval_episodes": args.eval_episodes,
        },
        "curves": {name: [r.get("curve") for r in rows] for name, rows in runs.items()},
    }
    print(f"\n{args.task}, sparse reward, {args.steps} env steps, {len(runs['residual'])} seeds")
    print(f"{'learner':<10}{'success':>9}{'std':>7}{'return':>9}{'s/run':>8}")
    for name, row in headline["table"].items():
        cells = [row["success"], row["success_std"], row["return"], row["seconds_per_run"]]
        print(f"{name:<10}" + "".join(f"{c:>9.2f}" if c is not None else f"{'-':>9}" for c in cells))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "residual.json").write_text(json.dumps(headline, indent=2) + "\n")
    plot(runs, args)
    return headline


def plot(runs: dict[str, list[dict]], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name in ("residual", "rlpd", "sac"):
        curves = [r["curve"] for r in runs[name]]
        if not curves:
            continue
        steps = [p[0] for p in curves[0]]
        means = [statistics.fmean(c[i][1] for c in curves if i < len(c)) for i in range(len(steps))]
        ax.plot(steps, means, marker="o", label=name)
        for c in curves:
            ax.plot([p[0] for p in c], [p[1] for p in c], alpha=0.2, color=ax.lines[-1].get_color())
    bc = [r["success"] for r in runs["bc"] if r.get("success") is not None]
    if bc:
        ax.axhline(statistics.fmean(bc), color="k", linestyle="--", label="bc (no env steps)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("evaluation success rate")
    ax.set_title(f"{args.task}, sparse reward ({len(bc)} seeds; faint: each seed)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "residual.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
