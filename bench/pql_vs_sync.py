"""Parallel Q-Learning against the synchronous loop: wall-clock to a return threshold, and env-count scaling.

Both columns run the same learner (SAC) with the same hyperparameters and the same update ratios
(1 critic update per vectorized env step, 1 policy update per 2 critic updates: `policy_delay=2`
in the synchronous loop, `pql.critic_updates_per_policy_update=2` in PQL), one after the other in
this invocation, on cartpole swing-up. Time to threshold is the wall-clock of the whole run, which
stops at the first evaluation reaching the threshold (including PQL's process start-up). CPU use is
user+system CPU seconds of this process and its children divided by wall-clock seconds.
Scaling: env steps per second after warm-up for 16 to 1024 envs, same ratios.

Prints a table, writes bench/results/pql_vs_sync.json and prints the same JSON as its last line.
Headline key: time_to_threshold_ratio (synchronous / PQL wall-clock).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from q2real.agents.train import TrainConfig, train
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
    return {
        "wall_s": wall,
        "cpu_cores_used": (_cpu_seconds() - cpu) / wall,
        "env_steps": trainer.step,
        "eval": trainer.last_eval,
        "env_steps_per_s": trainer.step / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=500.0)
    parser.add_argument("--budget", type=int, default=300_000, help="env steps before giving up")
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--scaling", type=int, nargs="*", default=[16, 64, 256, 1024])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    common = ["env.task=cartpole_swingup", f"env.seed={args.seed}", "checkpoint_every=0"]
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as root:
        learn = [*common, f"env.num_envs={args.envs}", f"total_steps={args.budget}", "eval_every=10000"]
        learn += [f"stop_return={args.threshold}", "warmup_steps=5000", "log.interval_steps=10000"]
        for mode in ("sync", "pql"):
            rows[mode] = run(mode, learn, root)
            print(f"{mode}: {rows[mode]}", flush=True)
        scaling: dict[int, dict[str, float]] = {}
        for envs in args.scaling:
            steps = max(envs * 120, 8000)
            short = [*common, f"env.num_envs={envs}", f"total_steps={steps}", f"warmup_steps={envs * 20}"]
            short += ["eval_every=0", "eval_envs=2", f"log.interval_steps={steps}"]
            scaling[envs] = {mode: run(mode, short, root)["env_steps_per_s"] for mode in ("sync", "pql")}
            print(f"{envs} envs: {scaling[envs]}", flush=True)
    reached = {m: r["eval"] is not None and r["eval"] >= args.threshold for m, r in rows.items()}
    print(f"\ncartpole_swingup, SAC, {args.envs} envs, threshold {args.threshold}, budget {args.budget} env steps")
    print(f"{'loop':<6} {'reached':>7} {'wall s':>8} {'env steps':>10} {'final eval':>10} {'CPU cores':>9}")
    for mode, r in rows.items():
        print(
            f"{mode:<6} {reached[mode]!s:>7} {r['wall_s']:>8.1f} {r['env_steps']:>10} {r['eval']:>10.1f} "
            f"{r['cpu_cores_used']:>9.2f}"
        )
    print(f"\n{'envs':>6} {'sync steps/s':>12} {'pql steps/s':>12} {'ratio':>6}")
    for envs, r in scaling.items():
        print(f"{envs:>6} {r['sync']:>12.0f} {r['pql']:>12.0f} {r['pql'] / r['sync']:>6.2f}")
    result = {
        "time_to_threshold_ratio": round(rows["sync"]["wall_s"] / rows["pql"]["wall_s"], 3),
        "threshold": args.threshold,
        "both_reached": all(reached.values()),
        "sync_wall_s": round(rows["sync"]["wall_s"], 1),
        "pql_wall_s": round(rows["pql"]["wall_s"], 1),
        "sync_cpu_cores": round(rows["sync"]["cpu_cores_used"], 2),
        "pql_cpu_cores": round(rows["pql"]["cpu_cores_used"], 2),
        "env_steps_per_s": {str(k): {m: round(v) for m, v in r.items()} for k, r in scaling.items()},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pql_vs_sync.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
