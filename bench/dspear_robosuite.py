"""SAC against SAC + D-SPEAR (and its two one-stream ablations) on robosuite Lift, same seeds and budget.

Arms: `uniform` (plain SAC), `dspear` (both streams, CV anchor), `critic_only` (prioritized critic
stream, actor on the critic's batch), `actor_only` (uniform critic, low-|TD| actor stream). Every arm
trains with the same config (Panda, dense reward, horizon 500, 4 envs over worker processes) for
`--steps` env steps per seed; the table reports the mean over seeds of the last logged training
episode return and success rate and of the final deterministic evaluation, and the learning curves
go to bench/results/dspear_robosuite.png. Writes bench/results/dspear_robosuite.json and prints it
as its last line.

Results: docs/results/learners.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from q2real.agents.config import TrainConfig
from q2real.agents.train import train  # noqa: E402
from q2real.configs.loader import load  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ARMS = {
    "uniform": [],
    "dspear": ["sampler.kind=dspear"],
    "critic_only": ["sampler.kind=dspear", "sampler.actor_stream=false"],
    "actor_only": ["sampler.kind=dspear", "sampler.critic_stream=false"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15_000, help="env steps per arm and seed")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--task", default="robosuite:Lift")
    args = parser.parse_args()
    curves: dict[str, list[tuple[list[int], list[float], list[float]]]] = {arm: [] for arm in ARMS}
    finals: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as root:
        for seed in args.seeds:
            for arm, extra in ARMS.items():
                overrides = [f"env.task={args.task}", "env.num_envs=4", f"env.seed={seed}", f"total_steps={args.steps}"]
                overrides += ["warmup_steps=2000", "eval_every=0", "eval_envs=2", "checkpoint_every=0"]
                overrides += ["log.interval_steps=1000", f"log.root={root}", f"log.name={arm}-{seed}", *extra]
                trainer = train(load(TrainConfig, None, overrides))
                logged = [json.loads(line) for line in (trainer.path / "metrics.jsonl").read_text().splitlines()]
                episodes = [m for m in logged if "episode_return" in m]
                curves[arm].append(
                    (
                        [m["step"] for m in episodes],
                        [m["episode_return"] for m in episodes],
                        [m.get("episode_success", 0.0) for m in episodes],
                    )
                )
                last = episodes[-1] if episodes else {}
                finals[arm].append(
                    {
                        "return": last.get("episode_return", float("nan")),
                        "success": last.get("episode_success", 0.0),
                        "eval": trainer.last_eval,
                    }
                )
                print(f"{arm} seed {seed}: {finals[arm][-1]}", flush=True)
    figure, (ax_return, ax_success) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, runs in curves.items():
        for i, (steps, returns, successes) in enumerate(runs):
            ax_return.plot(steps, returns, label=arm if i == 0 else None, color=f"C{list(ARMS).index(arm)}")
            ax_success.plot(steps, successes, color=f"C{list(ARMS).index(arm)}")
    ax_return.set(xlabel="env steps", ylabel="training episode return", title=f"{args.task}, SAC replay arms")
    ax_success.set(xlabel="env steps", ylabel="training episode success rate", ylim=(-0.05, 1.05))
    ax_return.legend()
    RESULTS.mkdir(exist_ok=True)
    figure.tight_layout()
    figure.savefig(RESULTS / "dspear_robosuite.png", dpi=100)
    print(f"\n{args.task}, {args.steps} env steps per arm, seeds {args.seeds}, 4 envs, horizon 500")
    print(f"{'arm':<12} {'train return':>12} {'train success':>13} {'eval return':>11}")
    summary = {}
    for arm, rows in finals.items():
        mean = {k: statistics.fmean(r[k] for r in rows) for k in ("return", "success", "eval")}
        summary[arm] = {k: round(v, 3) for k, v in mean.items()}
        print(f"{arm:<12} {mean['return']:>12.2f} {mean['success']:>13.2f} {mean['eval']:>11.2f}")
    result = {"task": args.task, "steps_per_arm": args.steps, "seeds": args.seeds, "arms": summary}
    (RESULTS / "dspear_robosuite.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
