"""Parallel Q-Learning against the synchronous loop: wall-clock to a return threshold, and env-count scaling.

Both loops run the same learner (SAC) with the same hyperparameters and the same update ratios
(1 critic update per vectorized env step, 1 policy update per 2 critic updates: `policy_delay=2`
in the synchronous loop, `pql.critic_updates_per_policy_update=2` in PQL), one after the other in
this invocation, on cartpole swing-up, for each seed. Time to threshold is the wall-clock of the
whole run, which stops at the first evaluation (every 10k env steps) reaching the threshold
(PQL's process start-up included); the headline is the ratio of the mean over seeds. CPU use is
user+system CPU seconds of this process and its children divided by wall-clock seconds.
Scaling: steady-state env steps per second (median logging window after warm-up) for 16 to 1024
envs, same ratios.

Prints a table, writes bench/results/pql_vs_sync.json and prints the same JSON as its last line.
Headline key: time_to_threshold_ratio (synchronous / PQL wall-clock).

Results: docs/results/speed.md
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

from q2real.agents.config import TrainConfig
from q2real.agents.train import train
from q2real.configs.loader import load

RESULTS = Path(__file__).resolve().parent / "results"


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(mode: str, overrides: list[str], root: str) -> dict:
    pql = ["pql.enabled=true", "pql.critic_updates_per_policy_update=2"]
    ratios = ["sac.policy_delay=2"] if mode == "sync" else pql
    config = load(TrainConfig, None, [*overrides, *ratios, f"log.root={root}", "log.tensorboard=false"])
    cpu, start = _cpu_seconds(), time.monotonic()
    trainer = train(config)
    wall = time.monotonic() - start
    logged = [json.loads(line) for line in (trainer.path / "metrics.jsonl").read_text().splitlines()]
    rates = [m["env_steps_per_s"] for m in logged if "env_steps_per_s" in m]
    return {
        "wall_s": wall,
        "cpu_cores_used": (_cpu_seconds() - cpu) / wall,
        "env_steps": trainer.step,
        "eval": trainer.last_eval,
        # Steady state: the median logging window after warm-up and start-up (process spawn excluded).
        "env_steps_per_s": statistics.median(rates[2:]) if len(rates) > 2 else trainer.step / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=500.0)
    parser.add_argument("--budget", type=int, default=300_000, help="env steps before giving up")
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--scaling", type=int, nargs="*", default=[16, 64, 256, 1024])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    args = parser.parse_args()
    common = ["env.task=cartpole_swingup", "checkpoint_every=0"]
    runs: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory() as root:
        for seed in args.seeds:
            learn = [*common, f"env.seed={seed}", f"env.num_envs={args.envs}", f"total_steps={args.budget}"]
            learn += ["eval_every=10000", f"stop_return={args.threshold}", "warmup_steps=5000"]
            learn += ["log.interval_steps=10000"]
            for mode in ("sync", "pql"):
                runs[mode, seed] = run(mode, learn, root)
                print(f"{mode} seed {seed}: {runs[mode, seed]}", flush=True)
        scaling: dict[int, dict[str, float]] = {}
        for envs in args.scaling:
            steps = envs * 160
            short = [*common, f"env.num_envs={envs}", f"total_steps={steps}", f"warmup_steps={envs * 20}"]
            short += ["eval_every=0", "eval_envs=2", f"log.interval_steps={envs * 20}"]
            scaling[envs] = {mode: run(mode, short, root)["env_steps_per_s"] for mode in ("sync", "pql")}
            print(f"{envs} envs: {scaling[envs]}", flush=True)
    reached = {key: r["eval"] is not None and r["eval"] >= args.threshold for key, r in runs.items()}
    print(f"\ncartpole_swingup, SAC, {args.envs} envs, threshold {args.threshold}, budget {args.budget} env steps")
    print(f"{'loop':<6} {'seed':>4} {'reached':>7} {'wall s':>8} {'env steps':>10} {'eval':>8} {'CPU cores':>9}")
    for (mode, seed), r in runs.items():
        print(
            f"{mode:<6} {seed:>4} {reached[mode, seed]!s:>7} {r['wall_s']:>8.1f} {r['env_steps']:>10} "
            f"{r['eval']:>8.1f} {r['cpu_cores_used']:>9.2f}"
        )
    print(f"\n{'envs':>6} {'sync steps/s':>12} {'pql steps/s':>12} {'ratio':>6}   (steady state after warm-up)")
    for envs, r in scaling.items():
        print(f"{envs:>6} {r['sync']:>12.0f} {r['pql']:>12.0f} {r['pql'] / r['sync']:>6.2f}")

    def mean(mode: str, key: str) -> float:
        return statistics.fmean(runs[mode, seed][key] for seed in args.seeds)

    result = {
        "time_to_threshold_ratio": round(mean("sync", "wall_s") / mean("pql", "wall_s"), 3),
        "threshold": args.threshold,
        "seeds": args.seeds,
        "all_reached": all(reached.values()),
        "sync_wall_s": [round(runs["sync", s]["wall_s"], 1) for s in args.seeds],
        "pql_wall_s": [round(runs["pql", s]["wall_s"], 1) for s in args.seeds],
        "sync_env_steps": [runs["sync", s]["env_steps"] for s in args.seeds],
        "pql_env_steps": [runs["pql", s]["env_steps"] for s in args.seeds],
        "sync_cpu_cores": round(mean("sync", "cpu_cores_used"), 2),
        "pql_cpu_cores": round(mean("pql", "cpu_cores_used"), 2),
        "env_steps_per_s": {str(k): {m: round(v) for m, v in r.items()} for k, r in scaling.items()},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pql_vs_sync.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
