"""Data-parallel training: 1 process against 2 torchrun ranks on this machine, same job per rank.

Each run is `q2real train` (SAC 256x256, batch 256, UTD 1, 4 envs per rank, native MuJoCo) on
pendulum swing-up in a fresh process, the 1-rank run with `threads=1` so each side has one core
per learner. Throughput is taken from the run's own metrics.jsonl after warm-up (no start-up time):
env steps/s over all ranks, and updates/s (each rank's, all ranks take the same updates, on a
batch of 256 each). With `--threshold R` it also trains both to an evaluation return of R and
reports the env steps and wall-clock each needed: 2 ranks at 1 update per iteration (twice the envs
per iteration, so half the updates per env step, each on twice the batch) and at 2.

The exactness figure runs tests/agents/dist_exactness.py under torchrun: the largest difference
between a 2-rank TD3 update (gradients and weights after one critic and actor step) and one
process's update on the two batches concatenated. bench/grad_sync.py then times a SAC critic update
with q2real's flat all-reduce against DistributedDataParallel (and no sync at all).

Prints a table, writes bench/results/distributed.json and prints the same JSON as its last line.
Headline keys: scaling_efficiency_2 (2-rank env steps/s / (2 x 1-rank env steps/s)) and
grad_exactness_max_abs_diff.

Results: docs/results/speed.md
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


def two_ranks(script: Path) -> dict:
    """The JSON line a 2-rank torchrun of `script` prints last."""
    out = subprocess.run([*TORCHRUN, "--nproc-per-node=2", str(script)], capture_output=True, text=True, env=ENV)
    if out.returncode != 0:
        raise SystemExit(f"{script.name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


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
            # 2 ranks at 1 update per iteration take half the updates per env step (each on twice the
            # batch); at 2 they take as many as one process.
            for label, ranks, utd in (("1", 1, 1), ("2", 2, 1), ("2_updates_per_step_2", 2, 2)):
                overrides = [*common, f"total_steps={args.max_steps}", "eval_every=4000", f"updates_per_step={utd}"]
                overrides.append(f"stop_return={args.threshold}")
                records = train(ranks, Path(tmp), f"threshold{label}", overrides)
                hit = next((r for r in records if r.get("eval_return", -1e9) >= args.threshold), None)
                best = max((r["eval_return"] for r in records if "eval_return" in r), default=None)
                reached[label] = {"steps": hit["step"], "seconds": hit["wall_time"]} if hit else None
                reached[f"{label}_best_eval_return"] = best
                print(f"{label} rank(s): threshold {args.threshold}: {reached[label]} (best {best})", flush=True)
            result["threshold"] = {"return": args.threshold, "max_steps": args.max_steps, "reached": reached}
    exact = two_ranks(ROOT / "tests" / "agents" / "dist_exactness.py")
    result["grad_exactness_max_abs_diff"] = float(exact["grad_exactness_max_abs_diff"])
    result["grad_sync"] = two_ranks(ROOT / "bench" / "grad_sync.py")
    print(f"\n{'ranks':<8}{'env steps/s':>14}{'updates/s/rank':>16}")
    for ranks, row in speed.items():
        print(f"{ranks:<8}{row['env_steps_per_s']:>14.1f}{row['updates_per_s']:>16.1f}")
    print(f"scaling efficiency (2 ranks): {result['scaling_efficiency_2']:.2f}")
    print(f"largest |2-rank - 1-process| after one update: {result['grad_exactness_max_abs_diff']:.2e}")
    print(f"\nSAC critic update, 2 ranks, ms{'no sync':>12}{'flat all-reduce':>18}{'DDP':>8}")
    for size, row in result["grad_sync"].items():
        print(f"{size:<30}{row['no_sync_ms']:>12.2f}{row['flat_all_reduce_ms']:>18.2f}{row['ddp_ms']:>8.2f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "distributed.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
