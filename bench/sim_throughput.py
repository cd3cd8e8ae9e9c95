"""Env-steps/s of q2real's native MuJoCo backend against its peers, side by side in one run.

For each model and batch size it times, on the same MJCF and the same physics substeps per env step,
the same work: every env starts from the model's initial state and runs EPISODE env steps (so a
humanoid falls the same way in every column and contact load matches):
  q2real env      q2real's TaskEnv (physics + torch task logic + auto-reset); cartpole only
  q2real backend  q2real's NativeBackend alone (one mujoco.rollout call per env step, C threads)
  mj_step loop    a plain single-thread Python loop of mujoco.mj_step over per-env MjData
  gymnasium       gymnasium's SyncVectorEnv over a minimal gymnasium MujocoEnv of the model
  C limit         mujoco.rollout stepping the whole batch many env steps in one call (no Python per step)
With --mjx (or when JAX sees a GPU) it adds q2real's MJX backend at --mjx-batch envs.

Prints a table, writes bench/results/sim_throughput.json and prints the same JSON as its last line.
Headline: ratio_vs_single_thread = best over models at batch >= 256 of (q2real backend / mj_step loop).

Results: docs/results/speed.md
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np
import torch
from mujoco import rollout

from q2real.hardware import model as robot_model
from q2real.hardware import robot_spec
from q2real.sim import make
from q2real.sim.backends.native import NativeBackend

RESULTS = Path(__file__).resolve().parent / "results"
EPISODE = 50


def timed(step: Callable[[], int], budget_s: float) -> float:
    """Env steps per second of `step` (which returns the env steps it did), after one warm-up call."""
    step()
    done, calls, start = 0, 0, time.perf_counter()
    while calls < 1 or time.perf_counter() - start < budget_s:
        done += step()
        calls += 1
    return done / (time.perf_counter() - start)


def ours_backend(model: mujoco.MjModel, substeps: int, batch: int) -> Callable[[], int]:
    backend = NativeBackend(model, batch, substeps, torch.device("cpu"))
    ctrl = torch.rand(batch, model.nu) * 0.2 - 0.1
    everyone = torch.ones(batch, dtype=torch.bool)
    qpos0 = torch.tensor(model.qpos0).expand(batch, -1)
    qvel0 = torch.zeros(batch, model.nv)

    def step() -> int:
        backend.set_state(everyone, qpos0, qvel0)
        for _ in range(EPISODE):
            backend.step(ctrl)
        return batch * EPISODE

    return step


def ours_env(batch: int) -> Callable[[], int]:
    env = make(task="cartpole_swingup", num_envs=batch, backend="mujoco", device="cpu")
    action = torch.rand(batch, env.action_dim) * 2 - 1

    def step() -> int:
        env.reset(seed=0)
        for _ in range(EPISODE):
            env.step(action)
        return batch * EPISODE

    return step


def single_thread(model: mujoco.MjModel, substeps: int, batch: int) -> Callable[[], int]:
    datas = [mujoco.MjData(model) for _ in range(batch)]
    ctrl = np.random.default_rng(0).uniform(-0.1, 0.1, (batch, model.nu))

    def step() -> int:
        for data in datas:
            mujoco.mj_resetData(model, data)
        for _ in range(EPISODE):
            for data, u in zip(datas, ctrl, strict=True):
                data.ctrl[:] = u
                for _ in range(substeps):
                    mujoco.mj_step(model, data)
        return batch * EPISODE

    return step


def gym_vector(model_path: str, substeps: int, batch: int) -> Callable[[], int]:
    import gymnasium as gym
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    class BareMujocoEnv(MujocoEnv):
        """The model and nothing else: physics plus a qpos/qvel observation."""

        def __init__(self):
            model = mujoco.MjModel.from_xml_path(model_path)
            self.metadata = {
                "render_modes": ["human", "rgb_array", "depth_array", "rgbd_tuple"],
                "render_fps": int(np.round(1.0 / (model.opt.timestep * substeps))),
            }
            space = gym.spaces.Box(-np.inf, np.inf, (model.nq + model.nv,), np.float64)
            super().__init__(model_path, substeps, observation_space=space)

        def _obs(self):
            return np.concatenate([self.data.qpos, self.data.qvel])

        def step(self, action):
            self.do_simulation(action, self.frame_skip)
            return self._obs(), 0.0, False, False, {}

        def reset_model(self):
            self.set_state(self.init_qpos, self.init_qvel)
            return self._obs()

    envs = gym.vector.SyncVectorEnv([BareMujocoEnv for _ in range(batch)])
    action = np.random.default_rng(0).uniform(-0.1, 0.1, envs.action_space.shape)

    def step() -> int:
        envs.reset(seed=0)
        for _ in range(EPISODE):
            envs.step(action)
        return batch * EPISODE

    return step


def c_limit(model: mujoco.MjModel, substeps: int, batch: int) -> Callable[[], int]:
    nthread = min(os.cpu_count() or 1, batch)
    pool = rollout.Rollout(nthread=nthread if nthread > 1 else 0)
    datas = [mujoco.MjData(model) for _ in range(max(nthread, 1))]
    state = np.empty(mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS))
    mujoco.mj_getState(model, datas[0], state, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    initial = np.tile(state, (batch, 1))
    nstep = EPISODE * substeps
    control = np.random.default_rng(0).uniform(-0.1, 0.1, (batch, nstep, model.nu))
    out = np.empty((batch, nstep, state.size))
    sensors = np.empty((batch, nstep, model.nsensordata))
    models = [model] * batch

    def step() -> int:
        pool.rollout(models, datas, initial, control, nstep=nstep, state=out, sensordata=sensors, skip_checks=True)
        return batch * EPISODE

    return step


def mjx_backend(model: mujoco.MjModel, substeps: int, batch: int) -> Callable[[], int]:
    from q2real.sim.backends.mjx import MjxBackend

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = MjxBackend(model, batch, substeps, device)
    ctrl = torch.rand(batch, model.nu, device=device) * 0.2 - 0.1
    everyone = torch.ones(batch, dtype=torch.bool, device=device)
    qpos0 = torch.tensor(model.qpos0, dtype=torch.float32, device=device).expand(batch, -1)
    qvel0 = torch.zeros(batch, model.nv, device=device)

    def step() -> int:
        backend.set_state(everyone, qpos0, qvel0)
        for _ in range(EPISODE):
            state = backend.step(ctrl)
        state.qpos.sum().item()  # wait for the device
        return batch * EPISODE

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256, 1024])
    parser.add_argument("--budget", type=float, default=1.5, help="seconds per measurement")
    parser.add_argument("--mjx", action="store_true", help="also time MJX (default only when JAX sees a GPU)")
    parser.add_argument("--mjx-batch", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(1)

    import gymnasium

    humanoid_xml = str(Path(gymnasium.__file__).parent / "envs/mujoco/assets/humanoid.xml")
    cartpole = robot_spec("cartpole")
    cartpole_model = robot_model.load_model(cartpole)
    models = {
        "cartpole": (cartpole_model, robot_model.substeps(cartpole, cartpole_model), str(cartpole.model_path)),
        "humanoid": (mujoco.MjModel.from_xml_path(humanoid_xml), 5, humanoid_xml),
    }
    run_mjx = args.mjx
    if not run_mjx:
        try:
            import jax

            run_mjx = jax.default_backend() == "gpu"
        except ImportError:
            pass

    rows = []
    for name, (model, substeps, path) in models.items():
        for batch in args.batches:
            row = {"model": name, "batch": batch, "substeps": substeps}
            if name == "cartpole":
                row["q2real_env"] = timed(ours_env(batch), args.budget)
            row["q2real_backend"] = timed(ours_backend(model, substeps, batch), args.budget)
            row["mj_step_loop"] = timed(single_thread(model, substeps, batch), args.budget)
            row["gymnasium_sync"] = timed(gym_vector(path, substeps, batch), args.budget)
            row["c_limit"] = timed(c_limit(model, substeps, batch), args.budget)
            row["ratio_vs_single_thread"] = row["q2real_backend"] / row["mj_step_loop"]
            row["ratio_vs_gymnasium"] = row["q2real_backend"] / row["gymnasium_sync"]
            row["fraction_of_c_limit"] = row["q2real_backend"] / row["c_limit"]
            rows.append(row)
            print(f"  measured {name} batch {batch}", flush=True)
        if run_mjx:
            rows.append(
                {
                    "model": name,
                    "batch": args.mjx_batch,
                    "substeps": substeps,
                    "q2real_mjx": timed(mjx_backend(model, substeps, args.mjx_batch), args.budget),
                }
            )

    header = ["model", "batch", "q2real env", "q2real backend", "mj_step loop", "gymnasium", "C limit"]
    header += ["x single", "x gym", "of C limit"]
    print("\nenv steps/s (one env step = `substeps` physics steps); ratios are q2real backend over the peer")
    print("  ".join(f"{h:>14}" for h in header))

    def cell(value, fmt="{:,.0f}"):
        return f"{'-' if value is None else fmt.format(value):>14}"

    for r in rows:
        if "q2real_mjx" in r:
            print(f"{r['model']:>14}  {r['batch']:>14}  MJX backend: {r['q2real_mjx']:,.0f} env steps/s")
            continue
        print(
            "  ".join(
                [f"{r['model']:>14}", f"{r['batch']:>14}"]
                + [cell(r.get(k)) for k in ("q2real_env", "q2real_backend", "mj_step_loop", "gymnasium_sync")]
                + [cell(r["c_limit"])]
                + [cell(r[k], "{:.2f}") for k in ("ratio_vs_single_thread", "ratio_vs_gymnasium")]
                + [cell(100 * r["fraction_of_c_limit"], "{:.0f}%")]
            )
        )
    big = [r for r in rows if r["batch"] >= 256 and "ratio_vs_single_thread" in r]
    best = max(big, key=lambda r: r["ratio_vs_single_thread"]) if big else None
    summary = {
        "ratio_vs_single_thread": round(best["ratio_vs_single_thread"], 3) if best else None,
        "ratio_vs_single_thread_model": best["model"] if best else None,
        "ratio_vs_single_thread_batch": best["batch"] if best else None,
        "best_fraction_of_c_limit": round(max(r["fraction_of_c_limit"] for r in big), 3) if big else None,
        "cpu_count": os.cpu_count(),
        "mujoco": mujoco.__version__,
        "rows": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sim_throughput.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
