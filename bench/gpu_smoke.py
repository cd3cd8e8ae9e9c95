"""GPU smoke run: SAC, FlashSAC, PQL and D-SPEAR for a few thousand steps on MJX + CUDA, then the
locomotion skill presets at GPU scale (`crossq_spot_joystick_mjx`, `crossq_gr1_stand_mjx`,
`crossq_gr1_legs_stand_mjx`, `crossq_gr1_joystick_mjx`: 4096 envs, batch 8192) for `--skill-minutes` of
wall-clock each.

Each learner trains through the shared loop with the env and the learner on the GPU (`env.backend=mjx`,
`env.device=cuda`), one after the other in this invocation, and reports its steady-state env steps/s
and gradient updates/s (the median logging window after the first, which holds the XLA compile).
The skill rows are also judged on physics as `bench/skills.py` judges the CPU recipes (the same
seeded 20 s episodes, stepped by native MuJoCo on the CPU) every `--skill-eval-every` env steps and
at the end, and their policies exported to `bench/results/skills/<task>_mjx.onnx` (their run
directories, less the checkpoint, to `bench/results/skills/runs/<task>_mjx`, for the transfer gate).
Overrides after the options go to the skill presets (`env.num_envs=8192`). Where torch sees no CUDA
device or JAX no GPU, it reports why and skips (exit status 0).

Prints a table, writes bench/results/gpu_smoke.json and prints the same JSON as its last line.
Headline keys: `<learner>_env_steps_per_s` and `<learner>_updates_per_s`, plus the skill rows' physics
figures under the keys `bench/skills.py` uses with `_mjx` appended (`spot_tracking_error_lin_mjx`;
`gr1_stand_rate_legs_mjx` for GR1 with its arms welded, `gr1_tracking_error_lin_mjx` for GR1 walking),
or `skipped` with the reason.

Results: docs/results/speed.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import torch
from skills import SKILLS_BY_TASK, keep  # bench/skills.py, beside this file
from skills import run as run_skills

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
SKILL_PRESETS = {
    "spot_crossq": ("spot_joystick", "crossq_spot_joystick_mjx", "_mjx"),
    "gr1_crossq": ("gr1_stand", "crossq_gr1_stand_mjx", "_mjx"),
    "gr1_legs_crossq": ("gr1_stand", "crossq_gr1_legs_stand_mjx", "_legs_mjx"),
    "gr1_joystick_crossq": ("gr1_joystick", "crossq_gr1_joystick_mjx", "_mjx"),
}
"""Rows that train a shipped preset as it is (its own task, envs and learner) for `--skill-minutes`:
row -> (the skill in `bench/skills.py` that judges it, the preset, the suffix of its headline keys)."""


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


def throughput(path: Path) -> dict[str, float | None]:
    """Steady-state rates: the median logging window after the first, which holds the XLA compile."""
    windows = [r for r in read_metrics(path / "metrics.jsonl") if "env_steps_per_s" in r][1:]
    learning = [r for r in windows if r.get("updates_per_s", 0) > 0]
    return {
        "env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in windows) if windows else None,
        "updates_per_s": statistics.median(r["updates_per_s"] for r in learning) if learning else None,
    }


def run(name: str, args: argparse.Namespace, root: str) -> dict:
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
        "checkpoint_every=0",
        "log.tensorboard=false",
        f"log.root={root}",
        f"log.name={name}",
    ]
    started = time.perf_counter()
    trainer = train(load(TrainConfig, None, overrides))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "env_steps": trainer.step, **throughput(trainer.path), "final_eval": trainer.last_eval}


def run_skill(name: str, args: argparse.Namespace, root: str) -> dict:
    """Train a skill preset for `--skill-minutes`, judged on physics as `bench/skills.py` judges."""
    skill_name, preset, suffix = SKILL_PRESETS[name]
    config = load(TrainConfig, preset, args.overrides)
    task, envs = config.env.task, config.env.num_envs
    logging = ["eval_every=0", "checkpoint_every=0", f"log.interval_steps={envs * 8}", f"log.root={root}"]
    result = run_skills(
        skill_name,
        config.env.seed,
        args.skill_minutes,
        args.skill_eval_every,
        args.skill_episodes,
        [*args.overrides, *logging, f"log.name={name}"],
        preset,
    )
    # No checkpoint: what comes back from a lent GPU is small files; the gate needs only the bundle.
    bundle = keep(result["run_dir"], f"{task}_mjx", checkpoint=False)
    skill = SKILLS_BY_TASK[skill_name]
    return {
        **{k: result[k] for k in ("preset", "seconds", "env_steps", "updates")},
        "overrides": args.overrides,
        **throughput(Path(result["run_dir"])),
        "final": result["final"],
        "headline": {f"{key}{suffix}": result["final"][figure] for key, figure in skill.headline.items()},
        "curve": result["curve"],
        "bundle": str(bundle),
        "bundle_bytes": bundle.stat().st_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="cartpole_swingup")
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per learner (summed over envs)")
    parser.add_argument("--skill-minutes", type=float, default=10.0, help="wall-clock per skill preset")
    parser.add_argument("--skill-eval-every", type=int, default=5_000_000, help="env steps between skill points")
    parser.add_argument("--skill-episodes", type=int, default=32, help="seeded episodes per skill point")
    rows = sorted(LEARNERS) + sorted(SKILL_PRESETS)
    parser.add_argument("--only", nargs="+", choices=rows, default=rows)
    parser.add_argument("overrides", nargs="*", help="config overrides for the skill presets")
    args = parser.parse_args()
    result: dict[str, object] = {"task": args.task, "num_envs": args.num_envs, "steps": args.steps}
    RESULTS.mkdir(exist_ok=True)
    reason = missing_gpu()
    if reason is not None:
        print(f"gpu_smoke: skipped: {reason}")
        result["skipped"] = reason
    else:
        result["device"] = torch.cuda.get_device_name()
        print(f"{'learner':<12}{'env steps/s':>14}{'updates/s':>12}{'seconds':>10}{'final eval':>12}")
        with tempfile.TemporaryDirectory(prefix="q2real-gpu-smoke-") as root:
            for name in args.only:
                try:
                    row = run_skill(name, args, root) if name in SKILL_PRESETS else run(name, args, root)
                except Exception as err:  # one row's failure must not cost the device time the others took
                    traceback.print_exc()
                    row = {"error": f"{type(err).__name__}: {err}"}
                result[name] = row
                if "error" not in row:
                    result[f"{name}_env_steps_per_s"] = row["env_steps_per_s"]
                    result[f"{name}_updates_per_s"] = row["updates_per_s"]
                    result |= row.get("headline", {})
                # Written after every row: a run cut off at its time limit keeps what it measured.
                (RESULTS / "gpu_smoke.json").write_text(json.dumps(result, indent=2))
                if "error" in row:
                    continue
                final_eval = row.get("final_eval")
                print(
                    f"{name:<12}{row['env_steps_per_s'] or float('nan'):>14,.0f}"
                    f"{row['updates_per_s'] or float('nan'):>12,.0f}{row['seconds']:>10.1f}"
                    f"{final_eval if final_eval is not None else float('nan'):>12.1f}"
                )
                for key, value in row.get("headline", {}).items():
                    print(f"  {key}: {value:.3f}")
    (RESULTS / "gpu_smoke.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
