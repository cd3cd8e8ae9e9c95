"""The transfer-gate table for policies trained here: Panda reach (headline) and Spot joystick locomotion.

Each policy is trained with SAC on the native MuJoCo backend under domain randomization (the
"in range" perturbations), exported as a policy bundle and put through `q2real transfer`: the bundle,
behind the safety shield, on MJX (the other backend) unperturbed, under each randomization effect at
its training range and beyond it, all together, and through the ROS 2 node against the sim robot
(Spot's through the base IMU and cmd_vel).
Ratios are mean return over the return as trained (the same bundle and shield on the training backend
with the training randomization, on the same episodes).

Prints both tables, writes bench/results/transfer.json (+ the gate plots) and prints the headline JSON
as its last line: transfer_ratio_in_range is the reach policy's ratio with every in-range
perturbation at once.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from q2real.agents.config import TrainConfig
from q2real.agents.train import train
from q2real.configs.loader import load
from q2real.gate.transfer import run_gate

RESULTS = Path(__file__).resolve().parent / "results"
REACH_DR = [
    "env.randomization.mass_scale=[0.8,1.2]",
    "env.randomization.damping_scale=[0.8,1.2]",
    "env.randomization.kp_scale=[0.8,1.2]",
    "env.randomization.kd_scale=[0.8,1.2]",
    "env.randomization.com_offset=0.01",
    "env.randomization.obs_noise_std=0.005",
    "env.randomization.action_latency=[0,1]",
    "env.randomization.push_force=[0.0,10.0]",
]
LOCOMOTION_DR = [
    "env.randomization.mass_scale=[0.9,1.1]",
    "env.randomization.friction_scale=[0.7,1.3]",
    "env.randomization.kp_scale=[0.9,1.1]",
    "env.randomization.obs_noise_std=0.01",
]
SAC = ["sac.actor_hidden=[256,256]", "sac.critic_hidden=[256,256]", "threads=2", "log.tensorboard=false"]


def trained(task: str, steps: int, envs: int, randomization: list[str], root: Path) -> tuple[Path, float]:
    overrides = [f"env.task={task}", f"env.num_envs={envs}", f"total_steps={steps}", "eval_every=10000"]
    overrides += ["checkpoint_every=0", f"log.root={root}", f"log.name={task}", *SAC, *randomization]
    start = time.perf_counter()
    trainer = train(load(TrainConfig, None, overrides))
    return trainer.path, time.perf_counter() - start


def table(report: dict) -> None:
    print(f"{'row':<26} {'':<9} {'return':>9} {'+-':>7} {'ratio':>7}")
    for r in report["rows"]:
        kind = "in range" if r["in_range"] else "beyond"
        print(f"{r['name']:<26} {kind:<9} {r['mean']:>9.2f} {r['std']:>7.2f} {r['ratio']:>7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reach-steps", type=int, default=100_000)
    parser.add_argument("--locomotion-steps", type=int, default=200_000, help="0 skips locomotion")
    parser.add_argument("--episodes", type=int, default=16, help="gate episodes per row")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="q2real-transfer-"))
    results: dict = {}
    try:
        run, seconds = trained("panda_reach", args.reach_steps, 4, REACH_DR, root)
        print(f"panda_reach: trained {args.reach_steps} env steps in {seconds:.0f} s")
        reach = run_gate(run, episodes=args.episodes, ros=True)
        results["panda_reach"] = {**reach, "train_steps": args.reach_steps, "train_seconds": seconds}
        shutil.copy(run / "transfer.png", RESULTS / "transfer_panda_reach.png")
        if args.locomotion_steps:
            run, seconds = trained("spot_joystick", args.locomotion_steps, 16, LOCOMOTION_DR, root)
            print(f"spot_joystick: trained {args.locomotion_steps} env steps in {seconds:.0f} s")
            rows = ["nominal", "all in range", "all beyond"]
            spot = run_gate(run, episodes=args.episodes, only=rows, ros=True)
            results["spot_joystick"] = {**spot, "train_steps": args.locomotion_steps, "train_seconds": seconds}
            shutil.copy(run / "transfer.png", RESULTS / "transfer_spot_joystick.png")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for task, report in results.items():
        print(
            f"\n{task}: return as trained {report['reference_return']:.2f} on the gate's episodes, logged "
            f"in-training evaluation {report['in_training_return']:.2f} "
            f"({report['train_steps']} env steps, {report['train_seconds']:.0f} s); "
            f"gate on {report['gate_backend']}, {report['episodes']} episodes per row"
        )
        table(report)
    (RESULTS / "transfer.json").write_text(json.dumps(results, indent=2))
    headline = {
        "transfer_ratio_in_range": round(results["panda_reach"]["transfer_ratio_in_range"], 3),
        "min_ratio_in_range": round(results["panda_reach"]["min_ratio_in_range"], 3),
        "transfer_ratio_in_range_lower": round(results["panda_reach"]["transfer_ratio_in_range_lower"], 3),
        "reach_return_as_trained": round(results["panda_reach"]["reference_return"], 2),
    }
    if "spot_joystick" in results:
        headline["locomotion_transfer_ratio_in_range"] = round(results["spot_joystick"]["transfer_ratio_in_range"], 3)
        headline["locomotion_return_as_trained"] = round(results["spot_joystick"]["reference_return"], 2)
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
