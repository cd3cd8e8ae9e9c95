"""Per-tick cost of the safety shield (state validity, action checks, limits, rate, effort) in RUN:
the compiled shield the node runs beside the numpy reference it is tested against, in one run.

Two specs with realistic limits: a 7-DoF arm (Franka Panda's published joint limits) and a 12-DoF
quadruped (Unitree Go2-like). Each runs 20k ticks with a tracking robot and random policy actions
(some outside [-1, 1]), garbage collected between ticks as the node's collector does; prints p50/p99,
writes bench/results/shield_tick.json and prints the same JSON as its last line. Headline keys:
tick_p99_us (the compiled shield on the 7-DoF arm), reference_tick_p99_us (the reference, same spec),
speedup_p50 and the kernels' import time (compile, or load from numba's cache). The workspace check
(MuJoCo forward kinematics of the target) is timed separately on the one position-controlled MJCF at
hand, the cartpole rail as a 1-DoF position robot.

Results: docs/results/deploy-loop.md
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from q2real.hardware import JointSpec, RobotSpec
from q2real.safety import Mode, ReferenceShield, ShieldConfig
from q2real.safety.compiled import COMPILE_SECONDS, Shield

RESULTS = Path(__file__).resolve().parent / "results"


def arm7() -> RobotSpec:
    lower = [-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973]
    upper = [2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973]
    default = [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]
    velocity = [2.175] * 4 + [2.61] * 3
    effort = [87.0] * 4 + [12.0] * 3
    joints = tuple(
        JointSpec(f"panda_joint{i + 1}", (lower[i], upper[i]), velocity[i], effort[i], default[i], 400.0, 40.0)
        for i in range(7)
    )
    return RobotSpec("arm7", Path("unused.xml"), "position", 0.02, joints, Path("arm7.yaml"))


def quadruped12() -> RobotSpec:
    joints = []
    for leg in ("FL", "FR", "RL", "RR"):
        joints += [
            JointSpec(f"{leg}_hip", (-1.05, 1.05), 30.0, 23.7, 0.0, 20.0, 0.5),
            JointSpec(f"{leg}_thigh", (-1.57, 3.49), 30.0, 23.7, 0.8, 20.0, 0.5),
            JointSpec(f"{leg}_calf", (-2.72, -0.84), 20.0, 45.4, -1.5, 20.0, 0.5),
        ]
    return RobotSpec("quadruped12", Path("unused.xml"), "position", 0.02, tuple(joints), Path("q12.yaml"))


def cartpole_position(tmp: Path) -> RobotSpec:
    import shutil

    import yaml

    from q2real.hardware import load_spec
    from q2real.hardware.spec import HARDWARE_DIR

    shutil.copy(HARDWARE_DIR / "cartpole" / "model.xml", tmp / "model.xml")
    data = yaml.safe_load((HARDWARE_DIR / "cartpole" / "robot.yaml").read_text())
    data["control_mode"] = "position"
    data["joints"][0].update(kp=200.0, kd=10.0)
    (tmp / "robot.yaml").write_text(yaml.safe_dump(data))
    return load_spec(tmp / "robot.yaml")


def measure(
    spec: RobotSpec, ticks: int, config: ShieldConfig | None = None, kind: type[ReferenceShield] = Shield
) -> dict[str, float]:
    shield = kind(spec, config or ShieldConfig(fallback="hold", ramp_time=0.1))
    rng = np.random.default_rng(0)
    names = spec.joint_names
    q = spec.array("default_position").copy()
    qd = np.zeros(spec.num_joints)
    now = 0.0

    def tick(action):
        nonlocal now, q
        now += spec.control_period
        cmd = shield.tick(names, q, qd, now, now, action, 0.001)
        q = cmd.position
        return cmd

    tick(None)
    shield.start()
    for _ in range(10):
        tick(None)
    assert shield.run() and shield.mode == Mode.RUN
    actions = rng.normal(0, 0.7, (ticks, spec.num_joints))
    samples = np.empty(ticks)
    gc.collect()
    gc.disable()
    try:
        for i in range(ticks):
            start = time.perf_counter_ns()
            tick(actions[i])
            samples[i] = time.perf_counter_ns() - start
            gc.collect(0)
    finally:
        gc.enable()
    assert shield.mode == Mode.RUN
    return {"p50_us": float(np.percentile(samples, 50) / 1e3), "p99_us": float(np.percentile(samples, 99) / 1e3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=20_000)
    args = parser.parse_args()
    specs = {"7-DoF arm": arm7(), "12-DoF quadruped": quadruped12()}
    rows = {}
    for name, spec in specs.items():
        for kind, label in ((Shield, "compiled"), (ReferenceShield, "reference")):
            rows[f"{name}, {label}"] = measure(spec, args.ticks, kind=kind)
    with tempfile.TemporaryDirectory() as tmp:
        spec = cartpole_position(Path(tmp))
        box = dict(workspace_points=("cart",), workspace_lower=(-1.0, -1, -1), workspace_upper=(1.0, 1, 1))
        fk = {
            "without FK": measure(spec, args.ticks),
            "with FK": measure(spec, args.ticks, ShieldConfig(fallback="hold", ramp_time=0.1, **box)),
        }
    print(f"\nshield tick cost over {args.ticks} ticks in RUN (us); kernels imported in {COMPILE_SECONDS:.2f} s")
    print(f"{'spec':<36}{'p50':>10}{'p99':>10}")
    for name, r in rows.items():
        print(f"{name:<36}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}")
    for name, r in fk.items():
        print(f"{'1-DoF rail, compiled, ' + name:<36}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}")
    arm, reference = rows["7-DoF arm, compiled"], rows["7-DoF arm, reference"]
    result = {
        "tick_p99_us": round(arm["p99_us"], 2),
        "reference_tick_p99_us": round(reference["p99_us"], 2),
        "tick_p50_us": round(arm["p50_us"], 2),
        "reference_tick_p50_us": round(reference["p50_us"], 2),
        "speedup_p50": round(reference["p50_us"] / arm["p50_us"], 1),
        "kernel_import_s": round(COMPILE_SECONDS, 2),
        "workspace_fk": {k: {m: round(v, 2) for m, v in r.items()} for k, r in fk.items()},
        "rows": {k: {m: round(v, 2) for m, v in r.items()} for k, r in rows.items()},
        "ticks": args.ticks,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "shield_tick.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
