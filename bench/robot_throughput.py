"""Env-steps/s of q2real's robot tasks on the CPU backend, side by side with their peers in one run.

For every robot task and batch size, with uniform random actions in [-1, 1]:
  q2real env     the task's TaskEnv (native MuJoCo, C threads; torch task logic, auto-reset)
  bare MuJoCo    mujoco.rollout on the same compiled model (task scene included), same batch and
                 physics substeps per env step, fixed controls: the physics cost with no q2real on top
  playground     MuJoCo Playground's own environment for the same robot (through q2real's playground
                 adapter), where Playground has one; its robot models come from a menagerie checkout it
                 downloads on first use, so offline the column says why it could not run
  robosuite      robosuite's Panda (Lift, OSC at 20 Hz, one worker process per core) for the arm tasks,
                 at the batch it can hold (4 envs)
With --mjx it adds q2real's MJX backend (on CPU, correctness only: XLA on CPU is far slower than native).

Prints a table, writes bench/results/robot_throughput.json and prints the same JSON as its last line.

Results: docs/results/speed.md
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np
import torch
from mujoco import rollout

from q2real.sim import make

RESULTS = Path(__file__).resolve().parent / "results"
TASKS = ("panda_reach", "panda_push", "spot_joystick", "gr1_stand")
# Playground has Spot and Panda tasks but no GR1; its G1 humanoid is the nearest.
PLAYGROUND_PEER = {
    "panda_push": "PandaPickCube",
    "spot_joystick": "SpotFlatTerrainJoystick",
    "gr1_stand": "G1JoystickFlatTerrain",
}
ROBOSUITE_PEER = {"panda_reach": "Lift", "panda_push": "Lift"}


def timed(step: Callable[[], int], seconds: float) -> float:
    step()  # warm-up (compilation, first contacts)
    done, start = 0, time.perf_counter()
    while done == 0 or time.perf_counter() - start < seconds:
        done += step()
    return done / (time.perf_counter() - start)


def env_rate(task: str, batch: int, seconds: float, backend: str = "mujoco") -> float:
    env = make(task=task, num_envs=batch, backend=backend, device="cpu")
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    actions = [torch.rand(batch, env.action_dim, generator=gen) * 2 - 1 for _ in range(16)]

    def step() -> int:
        for a in actions:
            env.step(a)
        return batch * len(actions)

    try:
        return timed(step, seconds)
    finally:
        env.close()


def bare_rate(task: str, batch: int, seconds: float) -> float:
    env = make(task=task, num_envs=1, backend="mujoco", device="cpu")
    model, substeps = env.backend.model, env.backend.substeps
    hold = env.task.action_to_ctrl(torch.zeros(1, env.action_dim)).double().numpy()  # the default pose
    env.close()
    pool = rollout.Rollout(nthread=2)
    data = [mujoco.MjData(model) for _ in range(2)]
    state = np.empty(mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS))
    mujoco.mj_getState(model, data[0], state, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    states = np.tile(state, (batch, 1))
    ctrl = np.tile(hold, (batch, substeps, 1))
    out = np.empty((batch, substeps, states.shape[1]))

    def step() -> int:
        for _ in range(16):
            pool.rollout([model] * batch, data, states, ctrl, nstep=substeps, state=out, skip_checks=True)
            states[:] = out[:, -1]
        return batch * 16

    try:
        return timed(step, seconds)
    finally:
        pool.close()


def peer_rate(task: str, batch: int, seconds: float, backend: str = "mujoco") -> tuple[float | None, str]:
    try:
        return env_rate(task, batch, seconds, backend), ""
    except Exception as err:  # noqa: BLE001 - the reason goes into the table
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        return None, f"{type(err).__name__}: {reason[:90]}"


def _cell(row: dict, key: str, width: int, fmt: str = ".0f") -> str:
    value = row.get(key)
    return f"{value:>{width}{fmt}}" if isinstance(value, float) else f"{'-':>{width}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--seconds", type=float, default=3.0, help="timing window per cell")
    parser.add_argument("--mjx", action="store_true", help="add q2real's MJX backend (slow on CPU)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    notes: dict[str, str] = {}
    for task in TASKS:
        for batch in args.batches:
            row = {"task": task, "batch": batch, "q2real": env_rate(task, batch, args.seconds)}
            row["bare_mujoco"] = bare_rate(task, batch, args.seconds)
            row["q2real_over_bare"] = row["q2real"] / row["bare_mujoco"]
            if args.mjx:
                row["q2real_mjx"] = env_rate(task, batch, args.seconds, backend="mjx")
            rows.append(row)
            print(
                f"{task:<14} {batch:>5}  q2real {row['q2real']:>9.0f}  bare {row['bare_mujoco']:>9.0f}  "
                f"ratio {row['q2real_over_bare']:.2f}",
                flush=True,
            )
        if task in PLAYGROUND_PEER:
            name = PLAYGROUND_PEER[task]
            rate, why = peer_rate(f"playground:{name}", args.batches[0], args.seconds, backend="mjx")
            rows[-1]["playground"] = rate
            notes[f"playground:{name}"] = why or "ran"
        if task in ROBOSUITE_PEER:
            rate, why = peer_rate(f"robosuite:{ROBOSUITE_PEER[task]}", 4, args.seconds)
            q2real_4 = env_rate(task, 4, args.seconds)
            rows.append({"task": task, "batch": 4, "q2real": q2real_4, "robosuite": rate})
            notes[f"robosuite:{ROBOSUITE_PEER[task]}"] = why or "ran"

    print()
    print(
        f"{'task':<14} {'envs':>5} {'q2real':>10} {'bare MuJoCo':>12} {'q2real/bare':>12} {'robosuite':>10} "
        f"{'playground':>11}" + (f" {'q2real MJX':>11}" if args.mjx else "")
    )
    for r in rows:
        cells = [_cell(r, "q2real", 10), _cell(r, "bare_mujoco", 12), _cell(r, "q2real_over_bare", 12, ".2f")]
        cells += [_cell(r, "robosuite", 10), _cell(r, "playground", 11)]
        cells += [_cell(r, "q2real_mjx", 11)] if args.mjx else []
        print(f"{r['task']:<14} {r['batch']:>5} " + " ".join(cells))
    for peer, why in notes.items():
        print(f"{peer}: {why}")
    big = [r for r in rows if r["batch"] == max(args.batches)]
    summary = {
        "env_steps_per_s": {r["task"]: round(r["q2real"]) for r in big},
        "q2real_over_bare_mujoco": {r["task"]: round(r["q2real_over_bare"], 3) for r in big},
        "robosuite_peer_ratio": {r["task"]: round(r["q2real"] / r["robosuite"], 1) for r in rows if r.get("robosuite")},
        "peers": notes,
        "batch": max(args.batches),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "robot_throughput.json").write_text(json.dumps({"rows": rows, **summary}, indent=2))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
