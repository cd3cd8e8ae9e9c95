"""The transfer gate on policies trained here: Panda reach with and without the shield in the loop, a
negative control trained without randomization, and optionally Spot joystick locomotion.

Every policy is trained with SAC from its shipped preset (`sac_panda_reach`, `sac_spot_joystick`) on
the native MuJoCo backend, exported as a policy bundle and put through `q2real transfer`: the bundle,
behind the safety shield, under every perturbation the gate sizes for the robot, each ratio with its
paired 95 % bootstrap interval, and through the ROS 2 node against the sim robot over 8 of the same
episodes. The positive control and Spot are gated on MJX (the other backend), the two other Panda
runs on native MuJoCo. The three Panda runs:

- positive control: the preset (shield clamps in the loop with their change charged, the previous
  action observed, randomization covering every gate row);
- no shield in the loop: the preset with `env.shield_in_loop=false` (and so no shield penalty);
- negative control: the preset with none of its robustness measures: no randomization, no shield
  penalty, no previous action observed.

Prints each gate table, writes bench/results/transfer.json (headline and every report; the gate plots
beside it; `--reach NAME` retrains only that Panda run and keeps the other saved reports) and prints
the headline JSON as its last line: transfer_ratio_in_range_lower (the positive control's lowest
in-range interval bound), negative_control_fails (1 when the gate failed the negative control),
shield_intervention_rate_ratio (the fraction of the policy's ticks on which the node's shield changed
its command, on the ROS path, for the policy trained without the shield in the loop over the one
trained with it) and shield_change_ratio (the same for how far the clamps moved the command); the
same two on the gate's simulated episodes are reported beside them.

Results: docs/results/gate.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

from q2real.agents.config import TrainConfig
from q2real.agents.train import train
from q2real.configs.loader import load
from q2real.gate.transfer import ROS_EPISODES, run_gate
from q2real.sim import RandomizationConfig

RESULTS = Path(__file__).resolve().parent / "results"
NO_RANDOMIZATION = [
    f"env.randomization.{f.name}={json.dumps(getattr(RandomizationConfig(), f.name))}".replace(" ", "")
    for f in dataclasses.fields(RandomizationConfig)
]
REACH = {
    "positive": [],
    "no_shield_in_loop": ["env.shield_in_loop=false", "env.shield_penalty=0"],  # the penalty charges the clamps
    # None of the preset's robustness measures. Measured: without randomization alone the preset's
    # smooth policy passes (latency 0.958 [0.937, 0.978], all together 0.951 [0.937, 0.967]).
    "negative": [*NO_RANDOMIZATION, "env.shield_penalty=0", "env.task_params.observe_last_action=false"],
}


def trained(preset: str, name: str, overrides: list[str], root: Path, steps: int | None) -> tuple[Path, float]:
    overrides = [f"log.root={root}", f"log.name={name}", *overrides]
    if steps is not None:
        overrides.append(f"total_steps={steps}")
    start = time.perf_counter()
    trainer = train(load(TrainConfig, preset, overrides))
    return trainer.path, time.perf_counter() - start


def save(results: dict, headline: dict | None = None) -> None:
    """After every gate, so that a failure later in the bench loses nothing measured."""
    (RESULTS / "transfer.json").write_text(json.dumps({"headline": headline, **results}, indent=2))


def table(report: dict) -> None:
    print(f"{'row':<22} {'':<9} {'return':>9} {'ratio':>7} {'95 % interval':>16} {'verdict':>8}  magnitude")
    for r in report["rows"]:
        kind = "in range" if r["in_range"] else "beyond"
        interval = "" if r["low"] is None else f"[{r['low']:.3f}, {r['high']:.3f}]"
        verdict = "pass" if r["passed"] else "FAIL" if r["required"] else "-"
        row = f"{r['name']:<22} {kind:<9} {r['mean']:>9.2f} {r['ratio']:>7.3f} {interval:>16} {verdict:>8}"
        print(f"{row}  {r['magnitude']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reach-steps", type=int, default=None, help="default: the preset's")
    parser.add_argument("--locomotion-steps", type=int, default=None, help="default: the preset's; 0 skips Spot")
    parser.add_argument("--episodes", type=int, default=16, help="gate episodes per row")
    parser.add_argument("--keep", type=Path, default=None, help="copy the trained runs here")
    parser.add_argument("--gate-backend", default=None, help="the positive control's gate backend (default: MJX)")
    parser.add_argument(
        "--reach",
        nargs="+",
        choices=list(REACH),
        default=list(REACH),
        help="the Panda runs to train and gate (default: all); the other reports come from the saved results",
    )
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="q2real-transfer-"))
    results: dict = {}
    if set(args.reach) != set(REACH):
        saved = json.loads((RESULTS / "transfer.json").read_text())
        results = {k: v for k, v in saved.items() if k != "headline"}
    try:
        for name in args.reach:
            overrides = REACH[name]
            run, seconds = trained("sac_panda_reach", f"panda_reach_{name}", overrides, root, args.reach_steps)
            print(f"panda_reach ({name}): trained in {seconds:.0f} s")
            # The controls' rows of interest (gains, payload, the shield) need no second backend, and MJX
            # on a CPU compiles every row afresh: they are gated on the training backend.
            backend = args.gate_backend if name == "positive" else "mujoco"
            ros_episodes = min(ROS_EPISODES, args.episodes)
            report = run_gate(run, backend, args.episodes, ros=name != "negative", ros_episodes=ros_episodes)
            results[f"panda_reach_{name}"] = {**report, "train_seconds": seconds}
            save(results)
            shutil.copy(run / "transfer.png", RESULTS / f"transfer_panda_reach_{name}.png")
        if args.locomotion_steps != 0:
            run, seconds = trained("sac_spot_joystick", "spot_joystick", [], root, args.locomotion_steps)
            print(f"spot_joystick: trained in {seconds:.0f} s")
            rows = ["nominal", "all together", "all beyond"]
            spot = run_gate(
                run, episodes=args.episodes, only=rows, ros=True, ros_episodes=min(ROS_EPISODES, args.episodes)
            )
            results["spot_joystick"] = {**spot, "train_seconds": seconds}
            save(results)
            shutil.copy(run / "transfer.png", RESULTS / "transfer_spot_joystick.png")
        if args.keep is not None:
            shutil.copytree(root, args.keep, dirs_exist_ok=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, report in results.items():
        verdict = "PASSED" if report["passed"] else f"FAILED on {', '.join(report['failed_rows'])}"
        print(
            f"\n{name}: return as trained {report['reference_return']:.2f} on the gate's episodes (no shield "
            f"{report['unshielded_return']:.2f}, logged evaluation {report['in_training_return']:.2f}; trained in "
            f"{report['train_seconds']:.0f} s); gate on {report['gate_backend']}, {report['episodes']} episodes "
            f"per row: {verdict}; the shield changed the command on {100 * report['shield_intervention_rate']:.1f} % "
            f"of ticks as trained ({', '.join(f'{k} {100 * v:.1f} %' for k, v in report['shield_rule_rates'].items())})"
        )
        table(report)
    positive, negative = results["panda_reach_positive"], results["panda_reach_negative"]
    unshielded = results["panda_reach_no_shield_in_loop"]

    def ratio(key: str) -> float | None:
        """Of the run trained without the shield in the loop over the one trained with it."""
        return round(unshielded[key] / positive[key], 3) if positive[key] else None

    headline = {
        "transfer_ratio_in_range_lower": round(positive["transfer_ratio_in_range_lower"], 3),
        "negative_control_fails": int(not negative["passed"]),
        "shield_intervention_rate_ratio": ratio("ros_shield_intervention_rate"),
        "shield_change_ratio": ratio("ros_shield_change"),
        "sim_shield_intervention_rate_ratio": ratio("shield_intervention_rate"),
        "sim_shield_change_ratio": ratio("shield_change"),
        "positive_control_passes": int(positive["passed"]),
        "reach_return_as_trained": round(positive["reference_return"], 2),
        "reach_return_without_shield": round(positive["unshielded_return"], 2),
    }
    for name, report in (("with", positive), ("without", unshielded)):
        for key in ("ros_shield_intervention_rate", "ros_shield_change", "shield_intervention_rate", "shield_change"):
            headline[f"{key}_{name}"] = round(report[key], 4)
    if "spot_joystick" in results:
        headline["locomotion_transfer_ratio_in_range"] = round(results["spot_joystick"]["transfer_ratio_in_range"], 3)
    save(results, headline)
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
