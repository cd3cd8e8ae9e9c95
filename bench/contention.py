"""The default training job alone and beside one busy process, for each torch thread policy.

Each run is `q2real train total_steps=12000 eval_every=0` (SAC 256x256 on pendulum swing-up, 4 envs,
native MuJoCo) in a fresh process, so the thread setting starts clean; "busy" adds one process
spinning a CPU core for the whole run, as a deploy node, a streaming learner or another job would.
Time is the run's own training wall-clock (the last `wall_time` in its metrics.jsonl: no import or
start-up time). Policies: the default (`threads=0`), 1 thread and 2 threads, run one after the other
in this invocation, `--rounds` times interleaved; each cell is the median over rounds.

Prints a table, writes bench/results/contention.json and prints the same JSON as its last line.
Headline keys: busy_over_quiet (the default's busy time over its quiet time; floor <= 1.5) and
quiet_vs_best (the default's quiet speed over the faster of 1 and 2 threads, quiet; floor >= 0.9).

Results: docs/results/speed.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from q2real.agents.common.metrics import read_metrics

RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = {"default": 0, "1 thread": 1, "2 threads": 2}
SPIN = "import time\nend = time.monotonic() + 3600\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def busy_neighbour(on: bool):
    process = subprocess.Popen([sys.executable, "-c", SPIN]) if on else None
    try:
        yield
    finally:
        if process is not None:
            process.kill()
            process.wait()


def train_seconds(threads: int, steps: int, root: Path, name: str) -> tuple[float, dict]:
    command = [sys.executable, "-m", "q2real.cli.main", "train", f"total_steps={steps}", "eval_every=0"]
    command += [f"threads={threads}", f"log.root={root}", f"log.name={name}", "log.tensorboard=false"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run(command, check=True, capture_output=True, env=env, timeout=3600)
    records = read_metrics(root / name / "metrics.jsonl")
    meta = json.loads((root / name / "meta.json").read_text())
    return float(records[-1]["wall_time"]), meta.get("threads", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", nargs="+", choices=sorted(POLICIES), default=list(POLICIES))
    args = parser.parse_args()
    times: dict[str, dict[str, list[float]]] = {p: {"quiet": [], "busy": []} for p in args.only}
    chosen: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="q2real-contention-") as tmp:
        for round_ in range(args.rounds):
            for policy in args.only:
                for load in ("quiet", "busy"):
                    with busy_neighbour(load == "busy"):
                        seconds, threads = train_seconds(
                            POLICIES[policy], args.steps, Path(tmp), f"{policy.replace(' ', '_')}-{load}-{round_}"
                        )
                    times[policy][load].append(seconds)
                    chosen[f"{policy} {load}"] = threads
                    print(f"round {round_ + 1}: {policy:<10} {load:<6} {seconds:7.1f} s  threads {threads}", flush=True)
    cell = {p: {load: statistics.median(v) for load, v in loads.items()} for p, loads in times.items()}
    print(f"\n{'policy':<12}{'quiet s':>10}{'busy s':>10}{'busy/quiet':>12}")
    for policy, row in cell.items():
        print(f"{policy:<12}{row['quiet']:>10.1f}{row['busy']:>10.1f}{row['busy'] / row['quiet']:>12.2f}")
    result: dict[str, object] = {"steps": args.steps, "rounds": args.rounds, "seconds": cell, "threads": chosen}
    if "default" in cell:
        result["busy_over_quiet"] = cell["default"]["busy"] / cell["default"]["quiet"]
        fixed = [cell[p]["quiet"] for p in ("1 thread", "2 threads") if p in cell]
        if fixed:
            result["quiet_vs_best"] = min(fixed) / cell["default"]["quiet"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "contention.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
