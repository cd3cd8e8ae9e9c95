"""Data-parallel training: 1 process against 2 torchrun ranks on this machine, same job per rank.

Each run is `q2real train` (SAC 256x256, batch 256, UTD 1, 4 envs per rank, native MuJoCo) on
pendulum swing-up in a fresh process, the 1-rank run with `threads=1` so each side has one core
per learner. Throughput is taken from the run's own metrics.jsonl after warm-up (no start-up time):
env steps/s over all ranks, and updates/s (each rank's, all ranks take the same updates, on a
batch of 256 each). With `--threshold R` it also trains both to an evaluation return of R and
reports the env steps and wall-clock each needed (2 ranks: twice the envs per iteration, half the
updates per env step, each on twice the batch).

The exactness figure runs tests/agents/dist_exactness.py under torchrun: the largest difference
between a 2-rank TD3 update (gradients and weights after one critic and actor step) and one
process's update on the two batches concatenated.

Prints a table, writes bench/results/distributed.json and prints the same JSON as its last line.
Headline keys: scaling_efficiency_2 (2-rank env steps/s / (2 x 1-rank env steps/s)) and
grad_exactness_max_abs_diff.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from q2real.agents.common.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
ENV = os.environ | {"OMP_NUM_THREADS": "1"}


def train(ranks: int, root: Path, name: str, overrides: list[str]) -> list[dict]:
    """One training run; its metric records."""
    args = ["-m", "q2real.cli.main", "train", f"log.root={root}", f"log.name={name}", "log.tensorboard=false"]
    args += ["threads=1", *overrides]
    command = [*TORCHRUN, f"--nproc-per-node={ranks}", *args] if ranks > 1 else [sys.executable, *args]
    out = subprocess.run(command, capture_output=True, text=True, env=ENV)
    if out.returncode != 0:
        raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
    return read_metrics(root / name / "metrics.jsonl")


def throughput(records: list[dict], warmup: int) -> tuple[float, float]:
    """(env steps/s over all ranks, updates/s per rank) over the records after warm-up."""
    rows = [r for r in records if "env_steps_per_s" in r and r["step"] > warmup]
    first, last = rows[0], rows[-1]
    steps = (last["step"] - first["step"]) / (last["wall_time"] - first["wall_time"])
    return steps, sum(r["updates_per_s"] for r in rows[1:]) / len(rows[1:])


def exactness() -> float:
    script = ROOT / "tests" / "agents" / "dist_exactness.py"
    out = subprocess.run([*TORCHRUN, "--nproc-per-node=2", str(script)], capture_output=True, text=True, env=ENV)
    if out.returncode != 0:
        raise SystemExit(f"exactness check failed:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["grad_exactness_max_abs_diff"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16_000, help="env steps per run, over all ranks")
    parser.add_argument("--threshold", type=float, default=None, help="also train to this evaluation return")
    parser.add_argument("--max-steps", type=int, default=60_000, help="budget of the threshold runs")
    args = parser.parse_args()
    warmup = 4_000
    common = ["env.num_envs=4", "checkpoint_every=0", "log.interval_steps=2000", f"warmup_steps={warmup}"]
    result: dict[str, object] = {"steps": args.steps}
    with tempfile.TemporaryDirectory(prefix="q2real-dist-") as tmp:
        speed = {}
        for ranks in (1, 2):
            steps, updates = throughput(
                train(ranks, Path(tmp), f"speed{ranks}", [*common, "eval_every=0", f"total_steps={args.steps}"]), warmup
            )
            speed[ranks] = {"env_steps_per_s": steps, "updates_per_s": updates}
            print(f"{ranks} rank(s): {steps:8.1f} env steps/s  {updates:7.1f} updates/s per rank", flush=True)
        result["throughput"] = speed
        result["scaling_efficiency_2"] = speed[2]["env_steps_per_s"] / (2 * speed[1]["env_steps_per_s"])
        if args.threshold is not None:
            reached = {}
            for ranks in (1, 2):
                overrides = [*common, f"total_steps={args.max_steps}", "eval_every=4000"]
                overrides.append(f"stop_return={args.threshold}")
                records = train(ranks, Path(tmp), f"threshold{ranks}", overrides)
                hit = next((r for r in records if r.get("eval_return", -1e9) >= args.threshold), None)
                reached[ranks] = {"steps": hit["step"], "seconds": hit["wall_time"]} if hit else None
                print(f"{ranks} rank(s): threshold {args.threshold}: {reached[ranks]}", flush=True)
            result["threshold"] = {"return": args.threshold, "reached": reached}
    result["grad_exactness_max_abs_diff"] = exactness()
    print(f"\n{'ranks':<8}{'env steps/s':>14}{'updates/s/rank':>16}")
    for ranks, row in speed.items():
        print(f"{ranks:<8}{row['env_steps_per_s']:>14.1f}{row['updates_per_s']:>16.1f}")
    print(f"scaling efficiency (2 ranks): {result['scaling_efficiency_2']:.2f}")
    print(f"largest |2-rank - 1-process| after one update: {result['grad_exactness_max_abs_diff']:.2e}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "distributed.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
