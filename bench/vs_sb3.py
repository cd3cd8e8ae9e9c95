"""q2real SAC against stable-baselines3 SAC, side by side in one invocation.

Three rows, each run in this invocation with the libraries alternating (never concurrently: 2 cores):
  (a) matched      the same hyperparameters: SB3's SAC() defaults (256x256, batch 256, lr 3e-4, one env,
                   one update per env step, learning starts at 100, temperature from 1.0), mirrored in
                   q2real; the headline `time_to_threshold_ratio`;
  (b) tuned        each library at its best published settings for Pendulum-v1: rl-baselines3-zoo's
                   (`learning_rate: 1e-3`, 20k steps) for SB3, the shipped preset `sac_pendulum_v1` for
                   q2real; `tuned_time_ratio`;
  (c) updates/s    gradient updates per second at equal batch, networks and optimizer on filled replay,
                   median of `--rounds` interleaved rounds, at Pendulum-v1's sizes and batch 256
                   (`updates_per_s_ratio`) and at the Spot skill preset's sizes and batch
                   (`updates_per_s_ratio_spot_recipe`), and at the Spot preset's sizes CrossQ, what
                   the preset trains, against sb3-contrib's CrossQ
                   (`crossq_updates_per_s_ratio_spot_recipe`). q2real runs four ways: compiled steps
                   in float32 (`compile`, the unsuffixed keys), eager (`_eager`), and both with
                   bfloat16 products (`matmul_dtype`, `_bf16` and `_bf16_eager`). `--updates-only`
                   reruns these rows alone.
Time to threshold is training wall-clock (evaluation time excluded) until the deterministic evaluation
mean (10 episodes, every --eval-every env steps) first reaches -200 on gymnasium's Pendulum-v1. Rows
(a) and (b) run every seed of `--seeds` on each side and report the medians. Both sides use 2 torch
threads.

Prints a table, writes bench/results/vs_sb3.json and prints the same JSON as its last line.
Headline keys: time_to_threshold_ratio, tuned_time_ratio, updates_per_s_ratio (SB3 / q2real time,
q2real / SB3 updates/s: above 1 means q2real is faster).

Results: docs/results/speed.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from q2real.agents.algos.crossq import CrossQ, CrossQConfig
from q2real.agents.algos.sac import SAC, SACConfig
from q2real.agents.callbacks import Callback, StopTraining
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.replay import ReplayStorage
from q2real.agents.common.samplers import UniformSampler
from q2real.agents.config import TrainConfig
from q2real.agents.train import Trainer
from q2real.configs.loader import load
from q2real.sim import make
from q2real.sim.vec_env import StepResult

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Outcome:
    env_steps: int | None
    seconds: float | None
    final_return: float
    total_steps: int


def run_sb3(
    make_env, make_eval_env, threshold: float, max_steps: int, eval_every: int, seed: int = 0, **kwargs
) -> Outcome:
    from stable_baselines3 import SAC as SB3SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    eval_env = make_eval_env()

    class Watch(BaseCallback):
        def __init__(self):
            super().__init__()
            self.eval_time, self.hit, self.last = 0.0, None, float("nan")

        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every:
                return True
            start = time.perf_counter()
            self.last = float(evaluate_policy(self.model, eval_env, n_eval_episodes=10, deterministic=True)[0])
            self.eval_time += time.perf_counter() - start
            if self.last >= threshold:
                self.hit = (self.num_timesteps, time.perf_counter() - self.start - self.eval_time)
                return False
            return True

    torch.manual_seed(seed)
    model = SB3SAC("MlpPolicy", make_env(), seed=seed, device="cpu", verbose=0, **kwargs)
    watch = Watch()
    watch.start = time.perf_counter()
    model.learn(total_timesteps=max_steps, callback=watch)
    steps, seconds = watch.hit if watch.hit else (None, None)
    return Outcome(steps, seconds, watch.last, model.num_timesteps)


class Watch(Callback):
    """Deterministic evaluation every `every` env steps; records when `threshold` is first reached."""

    def __init__(self, threshold: float, every: int):
        self.threshold, self.every = threshold, every
        self.eval_time, self.hit, self.last = 0.0, None, float("nan")

    def on_start(self, trainer: Trainer) -> None:
        self.start, self.next = time.perf_counter(), self.every

    def on_iteration(self, trainer: Trainer) -> None:
        if trainer.step < self.next:
            return
        self.next += self.every
        begin = time.perf_counter()
        self.last = trainer.evaluate()
        self.eval_time += time.perf_counter() - begin
        if self.last >= self.threshold:
            self.hit = (trainer.step, time.perf_counter() - self.start - self.eval_time)
            raise StopTraining


def run_q2real(preset: str | None, overrides: list[str], threshold: float, eval_every: int, tmp: Path) -> Outcome:
    base = ["eval_every=0", "checkpoint_every=0", "eval_envs=10", f"log.root={tmp}", "log.tensorboard=false"]
    config = load(TrainConfig, preset, [*overrides, *base])
    watch = Watch(threshold, eval_every)
    trainer = Trainer(config, callbacks=[watch])
    trainer.run()
    steps, seconds = watch.hit if watch.hit else (None, None)
    return Outcome(steps, seconds, watch.last, trainer.step)


class RandomBoxEnv(gym.Env):
    """Random transitions with a robot task's observation and action sizes: the update-rate rows time
    the learners on filled replay, where only the shapes matter."""

    def __init__(self, obs_dim: int, action_dim: int):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (action_dim,), np.float32)
        self.rng = np.random.default_rng(0)

    def reset(self, *, seed=None, options=None):
        return self.rng.standard_normal(self.observation_space.shape).astype(np.float32), {}

    def step(self, action):
        obs = self.rng.standard_normal(self.observation_space.shape).astype(np.float32)
        return obs, float(self.rng.standard_normal()), False, False, {}


def update_shapes() -> dict[str, tuple[int, int, int]]:
    """Update-rate rows: (observation size, action size, batch). `pendulum` is Pendulum-v1 at SB3's
    defaults; `spot_recipe` is the Spot skill preset's sizes and batch, where both libraries run SAC
    and, as the preset trains, CrossQ (sb3-contrib's), at the same networks and batch."""
    config = load(TrainConfig, "crossq_spot_joystick")
    env = make(dataclasses.replace(config.env, num_envs=1))
    try:
        spot = (env.obs_dim, env.action_dim, config.agent.batch_size)
    finally:
        env.close()
    return {"pendulum": (3, 1, 256), "spot_recipe": spot}


VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "": ("f32 compiled", {"compile": True}),
    "_eager": ("f32 eager", {}),
    "_bf16": ("bf16 compiled", {"compile": True, "matmul_dtype": "bfloat16"}),
    "_bf16_eager": ("bf16 eager", {"matmul_dtype": "bfloat16"}),
}
"""q2real's sides, by the suffix of their keys: (table label, learner settings). Float32 compiled (the
headline), float32 eager (the default `compile=false`), and both with bfloat16 hidden products."""


def updates_per_second(
    obs_dim: int, action_dim: int, batch: int, seconds: float, rounds: int, crossq: bool = False
) -> dict[str, float]:
    """Gradient updates/s of both SACs at equal batch, (256, 256) networks and Adam on stored
    transitions, q2real each way of `VARIANTS`, and with `crossq` both CrossQs (sb3-contrib's and
    q2real's, each at its defaults: policy delay 3, Adam beta1 0.5, batch renorm in actor and critics)
    at the same networks and batch, q2real's each way; the sides alternate for `rounds` rounds and each
    reports its median round. A warm-up call per side, untimed, holds q2real's compilation."""
    from sb3_contrib import CrossQ as SB3CrossQ
    from stable_baselines3 import SAC as SB3SAC

    env = gym.make("Pendulum-v1") if (obs_dim, action_dim) == (3, 1) else RandomBoxEnv(obs_dim, action_dim)
    filled = max(2_000, batch)

    def peer(learner, **kwargs):
        model = learner(
            "MlpPolicy", env, seed=0, device="cpu", batch_size=batch, learning_starts=filled, verbose=0, **kwargs
        )
        model.learn(total_timesteps=filled)  # fills its buffer through the normal path, without training
        return lambda: model.train(gradient_steps=25, batch_size=batch)

    storage = ReplayStorage(50_000, 1, obs_dim, action_dim, torch.device("cpu"))
    for _ in range(filled):
        obs = torch.randn(1, obs_dim)
        result = StepResult(obs, obs, torch.randn(1), *(torch.zeros(1, dtype=torch.bool),) * 2, torch.zeros(1))
        storage.add(obs, torch.rand(1, action_dim) * 2 - 1, result)
    sampler = UniformSampler()

    def ours(learner: type[SAC], config: SACConfig):
        agent = learner(config, Sizes(obs_dim, action_dim, 1, torch.device("cpu")))

        def work() -> None:
            for _ in range(25):
                agent.update(sampler.sample(storage, batch, 1, 0.99, 1))

        return work

    sides = {"sb3": peer(SB3SAC)}
    for suffix, (_, fields) in VARIANTS.items():
        sides[f"q2real{suffix}"] = ours(SAC, SACConfig(batch_size=batch, **fields))
    if crossq:  # what the skill recipe runs
        widths = {"net_arch": {"pi": [256, 256], "qf": [256, 256]}}  # its default critic is 1024 wide
        sides["sb3_crossq"] = peer(SB3CrossQ, policy_kwargs=widths)
        for suffix, (_, fields) in VARIANTS.items():
            sides[f"crossq{suffix}"] = ours(CrossQ, CrossQConfig(batch_size=batch, **fields))

    def rate(work) -> float:
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            work()
            count += 25
        return count / (time.perf_counter() - start)

    for work in sides.values():
        work()  # warm-up
    rates: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, work in sides.items():
            rates[side].append(rate(work))
    median = {side: float(np.median(r)) for side, r in rates.items()}
    ratios = {f"updates_per_s_ratio{suffix}": median[f"q2real{suffix}"] / median["sb3"] for suffix in VARIANTS}
    if crossq:
        for suffix in VARIANTS:
            ratios[f"crossq_updates_per_s_ratio{suffix}"] = median[f"crossq{suffix}"] / median["sb3_crossq"]
    return {**{f"{side}_updates_per_s": rate for side, rate in median.items()}, **ratios}


def update_rows(seconds: float, rounds: int) -> dict[str, dict[str, float]]:
    rows, shapes = {}, update_shapes()
    for name, (obs_dim, action_dim, batch) in shapes.items():
        print(f"updates/s, {name}: obs {obs_dim}, actions {action_dim}, batch {batch}, {rounds} rounds ...", flush=True)
        rows[name] = updates_per_second(obs_dim, action_dim, batch, seconds, rounds, crossq=name == "spot_recipe")
    print(f"\n{'updates/s':<22}{'batch':>6}{'peer':>8}" + "".join(f"{label:>16}" for label, _ in VARIANTS.values()))
    for name, row in rows.items():
        learners = [("SAC", "sb3", "q2real", "")] + [("CrossQ", "sb3_crossq", "crossq", "crossq_")] * (
            "crossq_updates_per_s" in row
        )
        for label, peer_key, ours_key, ratio_prefix in learners:
            rate = [row[f"{ours_key}{suffix}_updates_per_s"] for suffix in VARIANTS]
            ratio = [row[f"{ratio_prefix}updates_per_s_ratio{suffix}"] for suffix in VARIANTS]
            cells = "".join(f"{r:>8.1f} ({x:.2f}x)" for r, x in zip(rate, ratio, strict=True))
            print(f"{name + ' ' + label:<22}{shapes[name][2]:>6}{row[f'{peer_key}_updates_per_s']:>8.1f}{cells}")
    return rows


def headline_rates(rows: dict[str, dict[str, float]]) -> dict[str, float]:
    """`updates_per_s_ratio` is the pendulum row in float32 (equal arithmetic); the other rows keep
    their own keys."""
    out = dict(rows["pendulum"])
    for name, row in rows.items():
        if name != "pendulum":
            out |= {f"{key}_{name}": value for key, value in row.items()}
    return out


MATCHED = [
    "env.task=gymnasium:Pendulum-v1",
    "env.num_envs=1",
    "updates_per_step=1",
    "warmup_steps=100",
    "threads=2",
    "sac.actor_lr=3e-4",
    "sac.critic_lr=3e-4",
    "sac.alpha_lr=3e-4",
    "sac.init_alpha=1.0",
    "sac.batch_size=256",
    "sac.normalize_obs=false",
]
"""q2real with stable-baselines3's SAC() defaults."""


def median_outcome(outcomes: list[Outcome]) -> dict[str, object]:
    """Medians over seeds of the runs that reached the threshold, and how many did."""
    reached = [o for o in outcomes if o.seconds is not None]
    return {
        "seconds": statistics.median(o.seconds for o in reached) if reached else None,
        "env_steps": statistics.median(o.env_steps for o in reached) if reached else None,
        "reached": f"{len(reached)}/{len(outcomes)}",
        "runs": [o.__dict__ for o in outcomes],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=20_000, help="env-step cap for each run")
    parser.add_argument("--eval-every", type=int, default=1_000)
    parser.add_argument("--update-seconds", type=float, default=4.0, help="seconds per library per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the updates/s rows")
    parser.add_argument(
        "--updates-only", action="store_true", help="run the updates/s rows alone; the learning rows keep their figures"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    path = RESULTS / "vs_sb3.json"
    if args.updates_only and not path.is_file():
        parser.error(f"--updates-only merges into {path}, which a full run writes first")
    rates = update_rows(args.update_seconds, args.rounds)
    if args.updates_only:
        result = {k: v for k, v in json.loads(path.read_text()).items() if "updates_per_s" not in k}
        result = {k: v for k, v in result.items() if k != "update_rows"}  # written by an earlier version
        result |= headline_rates(rates) | {"torch_threads": torch.get_num_threads()}
    else:
        result = learning_rows(args) | headline_rates(rates)
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


def learning_rows(args: argparse.Namespace) -> dict[str, object]:
    """Time to threshold, matched and tuned, every seed on each side."""
    tmp = Path("/tmp/q2real-bench-vs-sb3") / time.strftime("%Y%m%d-%H%M%S")
    gym_env = lambda: gym.make("Pendulum-v1")  # noqa: E731
    runs: dict[str, dict[str, list[Outcome]]] = {row: {"sb3": [], "q2real": []} for row in ("matched", "tuned")}
    for seed in args.seeds:
        steps = [f"total_steps={args.max_steps}", f"env.seed={seed}"]
        print(f"seed {seed}: matched ...", flush=True)
        runs["matched"]["sb3"].append(run_sb3(gym_env, gym_env, -200.0, args.max_steps, args.eval_every, seed))
        runs["matched"]["q2real"].append(run_q2real(None, [*MATCHED, *steps], -200.0, args.eval_every, tmp))
        print(f"seed {seed}: tuned ...", flush=True)
        tuned_sb3 = run_sb3(gym_env, gym_env, -200.0, args.max_steps, args.eval_every, seed, learning_rate=1e-3)
        runs["tuned"]["sb3"].append(tuned_sb3)
        tuned = [*steps, "threads=2"]
        runs["tuned"]["q2real"].append(run_q2real("sac_pendulum_v1", tuned, -200.0, args.eval_every, tmp))

    def fmt(value, spec="{:,.0f}"):
        return "not reached" if value is None else spec.format(value)

    print(f"\n{'row':<10}{'lib':>8}{'reached':>9}{'env steps':>13}{'seconds':>13}  per seed (s)")
    summary: dict[str, dict[str, object]] = {}
    for row, pair in runs.items():
        medians = {lib: median_outcome(outcomes) for lib, outcomes in pair.items()}
        for lib, m in medians.items():
            per_seed = ", ".join(fmt(o.seconds, "{:.1f}") for o in pair[lib])
            print(
                f"{row:<10}{lib:>8}{m['reached']:>9}{fmt(m['env_steps']):>13}"
                f"{fmt(m['seconds'], '{:,.1f}'):>13}  {per_seed}"
            )
        sb3, ours = medians["sb3"]["seconds"], medians["q2real"]["seconds"]
        summary[row] = {**medians, "time_ratio": sb3 / ours if sb3 and ours else None}
    return {
        "time_to_threshold_ratio": summary["matched"]["time_ratio"],
        "tuned_time_ratio": summary["tuned"]["time_ratio"],
        "seeds": args.seeds,
        "runs": summary,
        "torch_threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    main()
