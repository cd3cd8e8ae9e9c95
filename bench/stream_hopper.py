"""Stream AC(lambda) on gymnasium's Hopper-v5 from one stream, at a budget this machine affords.

`q2real train algo=stream_ac env.task=gymnasium:Hopper-v5` with stream-x's settings (lr 1, gamma 0.99,
lambda 0.8, kappa 2 / 3, entropy 0.01, 2 x 128 sparse LayerNorm networks; the q2real defaults) and
one torch thread, `--seeds` seeds of `--steps` transitions each, evaluated without noise every
`--eval-every` transitions on 10 episodes. stream-x (Elsayed, Vasan & Mahmood 2024) publish their
curves to 2M transitions (Hopper 2173 at the end); their per-step values are in figures only, so the
comparison beside them is the curve's shape, not a ratio. The peer run in the same invocation is the
uniform-random policy on the same evaluation episodes (the floor the curve climbs from).

Headline keys: `final_return` (the mean over seeds of the last evaluation), `best_return`,
`random_return`, `final_over_random` and `transitions_per_s` (the whole run, evaluations
included). Prints a table, writes bench/results/stream_hopper.json and stream_hopper.png, and prints
the headline JSON as its last line. About 5 ms per transition here (1 thread), evaluations included.

Results: docs/results/learners.md
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from q2real.agents.callbacks import evaluate_episodes
from q2real.agents.common.metrics import read_metrics
from q2real.agents.stream.train import StreamTrainConfig, StreamTrainer
from q2real.configs.loader import load
from q2real.sim import EnvConfig, make

RESULTS = Path(__file__).resolve().parent / "results"
TASK = "gymnasium:Hopper-v5"
STREAM_X_HOPPER_2M = 2173.0
"""stream-x's Stream AC(lambda) on Hopper at 2M transitions (their paper's text)."""


def random_return(seed: int) -> float:
    env = make(EnvConfig(task=TASK, num_envs=10, seed=seed + 10_000))
    gen = torch.Generator().manual_seed(seed)
    try:
        returns, _, _ = evaluate_episodes(
            lambda obs: torch.rand(obs.shape[0], env.action_dim, generator=gen) * 2 - 1, env, seed + 10_000
        )
    finally:
        env.close()
    return float(returns.mean())


def run_seed(seed: int, steps: int, eval_every: int, root: Path) -> dict:
    overrides = [
        f"env.task={TASK}",
        f"env.seed={seed}",
        f"total_steps={steps}",
        f"eval_every={eval_every}",
        "checkpoint_every=0",
        f"log.root={root}",
        f"log.name=hopper-{seed}",
        "log.tensorboard=false",
    ]
    trainer = StreamTrainer(load(StreamTrainConfig, None, overrides))
    start = time.perf_counter()
    path = trainer.run()
    wall = time.perf_counter() - start
    curve = [(r["step"], r["eval_return"]) for r in read_metrics(path / "metrics.jsonl") if "eval_return" in r]
    return {"seed": seed, "wall_s": wall, "curve": curve}


def plot(runs: list[dict], floor: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        steps, values = zip(*run["curve"], strict=True)
        ax.plot([s / 1e3 for s in steps], values, marker="o", label=f"Stream AC(λ), seed {run['seed']}")
    ax.axhline(floor, color="grey", linestyle=":", label="uniform random")
    ax.set_xlabel("transitions (thousands), one stream, no replay")
    ax.set_ylabel("evaluation return (10 episodes)")
    ax.set_title(f"Stream AC(λ) on Hopper-v5 (stream-x: {STREAM_X_HOPPER_2M:.0f} at 2M)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150_000)
    parser.add_argument("--eval-every", type=int, default=15_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    torch.set_num_threads(1)

    floor = sum(random_return(seed) for seed in args.seeds) / len(args.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run_seed(seed, args.steps, args.eval_every, Path(tmp)) for seed in args.seeds]

    print(f"{'transitions':>12} " + " ".join(f"{'seed ' + str(r['seed']):>10}" for r in runs))
    for i, (step, _) in enumerate(runs[0]["curve"]):
        print(f"{step:>12} " + " ".join(f"{r['curve'][i][1]:>10.1f}" for r in runs if i < len(r["curve"])))
    final = sum(r["curve"][-1][1] for r in runs) / len(runs)
    best = max(v for r in runs for _, v in r["curve"])
    evals = len(runs[0]["curve"])
    headline = {
        "final_return": final,
        "best_return": best,
        "random_return": floor,
        "final_over_random": final / floor,
        "transitions_per_s": sum(args.steps / r["wall_s"] for r in runs) / len(runs),
        "transitions": args.steps,
        "stream_x_return_at_2m": STREAM_X_HOPPER_2M,
    }
    print(f"uniform random {floor:.1f}; final {final:.1f} (x{final / floor:.2f}), best {best:.1f}; {evals} evaluations")
    RESULTS.mkdir(exist_ok=True)
    plot(runs, floor, RESULTS / "stream_hopper.png")
    (RESULTS / "stream_hopper.json").write_text(json.dumps({**headline, "runs": runs}, indent=2) + "\n")
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
