"""q2real SAC against stable-baselines3 SAC, side by side in one invocation.

Runs one after the other on the same machine (never concurrently: 2 cores):
  (a) defaults     each library at what it ships for the task: SB3's SAC() defaults; q2real's preset
                   `sac_pendulum_v1` (gymnasium Pendulum-v1) or its default `q2real train` config
                   (q2real pendulum_swingup);
  (b) matched      same networks (256, 256), batch 256, one env, one update per env step, same lrs;
  (c) updates/s    gradient updates per second at equal batch, networks and optimizer, on filled replay.
Time to threshold is training wall-clock (evaluation time excluded) until the deterministic evaluation
mean (10 episodes, every --eval-every env steps) first reaches the threshold: -200 on Pendulum-v1, and
--task-threshold on q2real's pendulum_swingup (episode return of 500 steps, reward in [0, 1]).

Prints a table, writes bench/results/vs_sb3.json and prints the same JSON as its last line.
Headline keys: time_to_threshold_ratio (SB3 / q2real wall-clock, defaults, Pendulum-v1),
env_steps_ratio (q2real / SB3 env steps, same run), updates_per_s_ratio (q2real / SB3, matched).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from q2real.agents.callbacks import Callback, StopTraining
from q2real.agents.common.replay import ReplayStorage
from q2real.agents.common.samplers import UniformSampler
from q2real.agents.config import TrainConfig
from q2real.agents.sac import SAC, SACConfig
from q2real.agents.train import Trainer
from q2real.configs.loader import load
from q2real.sim import make
from q2real.sim.vec_env import StepResult, VecEnv

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Outcome:
    env_steps: int | None
    seconds: float | None
    final_return: float
    total_steps: int


class SingleEnv(gym.Env):
    """A one-env q2real VecEnv as a gymnasium env, so SB3 trains on exactly q2real's task."""

    def __init__(self, task: str, seed: int):
        self.env: VecEnv = make(task=task, num_envs=1, backend="mujoco", device="cpu", seed=seed)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.env.obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.env.action_dim,), np.float32)
        self._seed = seed
        self._obs: np.ndarray | None = None

    def reset(self, *, seed=None, options=None):
        if self._obs is None or seed is not None:
            self._obs = self.env.reset(seed=self._seed if seed is None else seed)[0].numpy()
        return self._obs, {}

    def step(self, action):
        result = self.env.step(torch.as_tensor(action, dtype=torch.float32).reshape(1, -1))
        # The q2real env has already auto-reset; SB3's reset() after a done then hands out that new obs.
        self._obs = result.obs[0].numpy()
        terminated, truncated = bool(result.terminated[0]), bool(result.truncated[0])
        return result.next_obs[0].numpy(), float(result.reward[0]), terminated, truncated, {}


def run_sb3(make_env, make_eval_env, threshold: float, max_steps: int, eval_every: int, **kwargs) -> Outcome:
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

    torch.manual_seed(0)
    model = SB3SAC("MlpPolicy", make_env(), seed=0, device="cpu", verbose=0, **kwargs)
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


def updates_per_second(batch: int, seconds: float, rounds: int = 3) -> dict[str, float]:
    """Gradient updates/s of both SACs at equal batch, (256, 256) networks and Adam on stored
    transitions; the libraries alternate for `rounds` rounds and each reports its median round."""
    from stable_baselines3 import SAC as SB3SAC

    env = gym.make("Pendulum-v1")
    model = SB3SAC("MlpPolicy", env, seed=0, device="cpu", batch_size=batch, learning_starts=0, verbose=0)
    model.learn(total_timesteps=2_000)  # fills its buffer through the normal path

    agent = SAC(SACConfig(batch_size=batch), 3, 1, 1, torch.device("cpu"))
    storage = ReplayStorage(50_000, 1, 3, 1, torch.device("cpu"))
    for _ in range(2_000):
        obs = torch.randn(1, 3)
        result = StepResult(obs, obs, torch.randn(1), *(torch.zeros(1, dtype=torch.bool),) * 2, torch.zeros(1))
        storage.add(obs, torch.rand(1, 1) * 2 - 1, result)
    sampler = UniformSampler()

    def sb3_updates() -> None:
        model.train(gradient_steps=25, batch_size=batch)

    def q2real_updates() -> None:
        for _ in range(25):
            agent.update(sampler.sample(storage, batch, 1, 0.99))

    def rate(work) -> float:
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            work()
            count += 25
        return count / (time.perf_counter() - start)

    sb3_updates(), q2real_updates()  # warm-up
    sb3, ours = [], []
    for _ in range(rounds):
        sb3.append(rate(sb3_updates))
        ours.append(rate(q2real_updates))
    sb3_rate, our_rate = float(np.median(sb3)), float(np.median(ours))
    return {"sb3_updates_per_s": sb3_rate, "q2real_updates_per_s": our_rate, "updates_per_s_ratio": our_rate / sb3_rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=30_000, help="env-step cap for each Pendulum-v1 run")
    parser.add_argument(
        "--task-max-steps",
        type=int,
        default=40_000,
        help="SB3's env-step cap on pendulum_swingup (q2real runs its default)",
    )
    parser.add_argument("--eval-every", type=int, default=1_000)
    parser.add_argument("--task-threshold", type=float, default=350.0)
    parser.add_argument("--skip-task", action="store_true", help="skip the q2real pendulum_swingup comparison")
    parser.add_argument("--update-seconds", type=float, default=5.0, help="seconds per library per round")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tmp = Path("/tmp/q2real-bench-vs-sb3") / time.strftime("%Y%m%d-%H%M%S")
    rows: dict[str, dict[str, Outcome]] = {}
    gym_env = lambda: gym.make("Pendulum-v1")  # noqa: E731
    print("updates/s at batch 256 ...", flush=True)
    throughput = updates_per_second(256, args.update_seconds)

    print("Pendulum-v1, defaults ...", flush=True)
    rows["Pendulum-v1 defaults"] = {
        "sb3": run_sb3(gym_env, gym_env, -200.0, args.max_steps, args.eval_every),
        "q2real": run_q2real("sac_pendulum_v1", [f"total_steps={args.max_steps}"], -200.0, args.eval_every, tmp),
    }
    print("Pendulum-v1, matched ...", flush=True)
    matched = ["env.task=gymnasium:Pendulum-v1", "env.num_envs=1", "updates_per_step=1", "warmup_steps=100"]
    matched += ["sac.actor_lr=3e-4", "sac.critic_lr=3e-4", "sac.batch_size=256", "sac.normalize_obs=false"]
    rows["Pendulum-v1 matched"] = {
        "sb3": run_sb3(gym_env, gym_env, -200.0, args.max_steps, args.eval_every),
        "q2real": run_q2real(None, [*matched, f"total_steps={args.max_steps}"], -200.0, args.eval_every, tmp),
    }
    if not args.skip_task:
        print("pendulum_swingup, defaults ...", flush=True)
        task_env = lambda: SingleEnv("pendulum_swingup", 0)  # noqa: E731
        task_eval = lambda: SingleEnv("pendulum_swingup", 10_000)  # noqa: E731
        rows["pendulum_swingup defaults"] = {
            "sb3": run_sb3(task_env, task_eval, args.task_threshold, args.task_max_steps, 5_000),
            "q2real": run_q2real(None, [], args.task_threshold, 5_000, tmp),
        }

    def fmt(value, spec="{:,.0f}"):
        return "not reached" if value is None else spec.format(value)

    print(f"\n{'run':<28}{'lib':>8}{'env steps':>14}{'seconds':>12}{'final eval':>12}")
    summary: dict[str, object] = {}
    for name, pair in rows.items():
        for lib, out in pair.items():
            seconds = fmt(out.seconds, "{:,.1f}")
            print(f"{name:<28}{lib:>8}{fmt(out.env_steps):>14}{seconds:>12}{out.final_return:>12.1f}")
        sb3, ours = pair["sb3"], pair["q2real"]
        key = name.replace(" ", "_").replace("-", "_").lower()
        both = sb3.seconds is not None and ours.seconds is not None
        summary[key] = {
            "sb3": sb3.__dict__,
            "q2real": ours.__dict__,
            "time_to_threshold_ratio": sb3.seconds / ours.seconds if both else None,
            "env_steps_ratio": ours.env_steps / sb3.env_steps if both else None,
        }
    print(
        f"\nupdates/s at batch 256, (256, 256) nets: q2real {throughput['q2real_updates_per_s']:.1f}, "
        f"SB3 {throughput['sb3_updates_per_s']:.1f} -> {throughput['updates_per_s_ratio']:.2f}x"
    )
    defaults = summary["pendulum_v1_defaults"]
    result = {
        "time_to_threshold_ratio": defaults["time_to_threshold_ratio"],
        "env_steps_ratio": defaults["env_steps_ratio"],
        "updates_per_s_ratio": throughput["updates_per_s_ratio"],
        **throughput,
        "runs": summary,
        "torch_threads": torch.get_num_threads(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "vs_sb3.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
