"""GPU smoke run: SAC, FlashSAC, PQL and D-SPEAR for a few thousand steps on MJX + CUDA, then the
locomotion skill presets at GPU scale (`crossq_spot_joystick_mjx`, `crossq_gr1_stand_mjx`: 4096 envs,
batch 8192) for `--skill-steps`.

Each learner trains through the shared loop with the env and the learner on the GPU (`env.backend=mjx`,
`env.device=cuda`), one after the other in this invocation, and reports its steady-state env steps/s
and gradient updates/s (the median logging window after the first, which holds the XLA compile).
Where torch sees no CUDA device or JAX no GPU, it reports why and skips (exit status 0).

Prints a table, writes bench/results/gpu_smoke.json and prints the same JSON as its last line.
Headline keys: `<learner>_env_steps_per_s` and `<learner>_updates_per_s`, or `skipped` with the reason.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from q2real.agents.common.metrics import read_metrics
from q2real.agents.config import TrainConfig
from q2real.agents.train import train
from q2real.configs.loader import load

RESULTS = Path(__file__).resolve().parent / "results"
LEARNERS = {
    "sac": ["algo=sac"],
    "flashsac": ["algo=flashsac"],
    "pql": ["algo=sac", "pql.enabled=true"],
    "dspear": ["algo=sac", "sampler.kind=dspear"],
}
SKILL_PRESETS = {"spot_crossq": "crossq_spot_joystick_mjx", "gr1_crossq": "crossq_gr1_stand_mjx"}
"""Rows that train a shipped preset as it is (its own task, envs and learner), for `--skill-steps`."""


def missing_gpu() -> str | None:
    """Why this machine cannot run the smoke test, or None."""
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        import jax
    except ImportError:
        return "JAX is not installed (pip install 'jax[cuda12]' -e '.[mjx]')"
    if not any(d.platform == "gpu" for d in jax.devices()):
        return f"JAX sees no GPU (devices: {jax.devices()}); install jax[cuda12]"
    return None


def run(name: str, args: argparse.Namespace, root: str) -> dict:
    logging = ["checkpoint_every=0", "log.tensorboard=false", f"log.root={root}", f"log.name={name}"]
    if name in SKILL_PRESETS:
        preset = load(TrainConfig, SKILL_PRESETS[name])
        envs = preset.env.num_envs
        config = load(
            TrainConfig,
            SKILL_PRESETS[name],
            [f"total_steps={args.skill_steps}", f"eval_every={args.skill_steps}", f"log.interval_steps={envs * 8}"]
            + logging,
        )
    else:
        overrides = [
            *LEARNERS[name],
            f"env.task={args.task}",
            "env.backend=mjx",
            "env.device=cuda",
            f"env.num_envs={args.num_envs}",
            f"total_steps={args.steps}",
            f"warmup_steps={args.num_envs * 4}",
            "eval_every=0",
            f"log.interval_steps={args.num_envs * 8}",
            *logging,
        ]
        config = load(TrainConfig, None, overrides)
    started = time.perf_counter()
    trainer = train(config)
    seconds = time.perf_counter() - started
    windows = [r for r in read_metrics(trainer.path / "metrics.jsonl") if "env_steps_per_s" in r][1:]
    learning = [r for r in windows if r.get("updates_per_s", 0) > 0]
    return {
        "seconds": seconds,
        "env_steps": trainer.step,
        "env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in windows) if windows else None,
        "updates_per_s": statistics.median(r["updates_per_s"] for r in learning) if learning else None,
        "final_eval": trainer.last_eval,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="cartpole_swingup")
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per learner (summed over envs)")
    parser.add_argument(
        "--skill-steps", type=int, default=2_000_000, help="env steps per skill preset (summed over envs)"
    )
    rows = sorted(LEARNERS) + sorted(SKILL_PRESETS)
    parser.add_argument("--only", nargs="+", choices=rows, default=rows)
    args = parser.parse_args()
    result: dict[str, object] = {"task": args.task, "num_envs": args.num_envs, "steps": args.steps}
    reason = missing_gpu()
    if reason is not None:
        print(f"gpu_smoke: skipped: {reason}")
        result["skipped"] = reason
    else:
        result["device"] = torch.cuda.get_device_name()
        print(f"{'learner':<10}{'env steps/s':>14}{'updates/s':>12}{'seconds':>10}{'final eval':>12}")
        with tempfile.TemporaryDirectory(prefix="q2real-gpu-smoke-") as root:
            for name in args.only:
                row = run(name, args, root)
                result[name] = row
                result[f"{name}_env_steps_per_s"] = row["env_steps_per_s"]
                result[f"{name}_updates_per_s"] = row["updates_per_s"]
                print(
                    f"{name:<10}{row['env_steps_per_s'] or float('nan'):>14,.0f}"
                    f"{row['updates_per_s'] or float('nan'):>12,.0f}{row['seconds']:>10.1f}"
                    f"{row['final_eval'] if row['final_eval'] is not None else float('nan'):>12.1f}"
                )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gpu_smoke.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
