"""`robosuite:<Env>` (e.g. robosuite:Lift, robosuite:Door): robosuite manipulation tasks as a q2real `VecEnv`.

Panda arm by default, proprioception + object state (no cameras, headless), robosuite's dense
(shaped) reward, 20 Hz control with its default OSC_POSE controller (actions already in [-1, 1]).
robosuite steps one env per call in Python, so the envs are spread over worker processes (one per
CPU core by default), each stepping its share in turn; observations come back float32 (robosuite
hands out float64). Episodes end only at the horizon (truncated; robosuite tasks never terminate);
`info["success"]` carries the task's success check every step, and training logs the episode
success rate. `env.task_params` go to `robosuite.make` (e.g. horizon, robots, control_freq).

robosuite 1.5.2 runs on MuJoCo <= 3.9.0 and must be installed with `pip install --no-deps
robosuite==1.5.2` next to `pip install "q2real[robosuite]"` (its mink pin needs numpy < 2).
"""

from __future__ import annotations

import multiprocessing
import os
import traceback

import numpy as np
import torch

from q2real.configs.errors import MissingDependency
from q2real.configs.loader import ConfigError
from q2real.sim.config import EnvConfig, resolve_device
from q2real.sim.vec_env import StepResult, VecEnv

DEFAULTS = {
    "robots": "Panda",
    "horizon": 500,
    "control_freq": 20,
    "reward_shaping": True,
    "has_renderer": False,
    "has_offscreen_renderer": False,
    "use_camera_obs": False,
    "use_object_obs": True,
}
TERMS = ("robot0_proprio-state", "object-state")


def _worker(name: str, kwargs: dict, count: int, seed: int, pipe) -> None:
    """Own `count` robosuite envs; answer reset/step requests with stacked float32 arrays."""
    try:
        import robosuite

        envs = [robosuite.make(name, seed=seed + i, **kwargs) for i in range(count)]

        def observe(obs: dict) -> np.ndarray:
            return np.concatenate([np.asarray(obs[t], dtype=np.float32).ravel() for t in TERMS])

        first = [env.reset() for env in envs]
        pipe.send(("ready", [[int(np.asarray(first[0][t]).size) for t in TERMS], envs[0].action_spec]))
        current = [observe(o) for o in first]
        while True:
            command, payload = pipe.recv()
            if command == "close":
                break
            if command == "reset":
                current = [observe(env.reset()) for env in envs]
                pipe.send(("ok", np.stack(current)))
                continue
            obs, next_obs, reward, truncated, success = [], [], [], [], []
            for i, env in enumerate(envs):
                raw, r, done, _ = env.step(payload[i])
                success.append(bool(env._check_success()))
                next_obs.append(observe(raw))
                reward.append(r)
                truncated.append(bool(done))
                current[i] = observe(env.reset()) if done else next_obs[-1]
                obs.append(current[i])
            pipe.send(
                ("ok", (np.stack(obs), np.stack(next_obs), np.array(reward), np.array(truncated), np.array(success)))
            )
    except BaseException:
        pipe.send(("error", traceback.format_exc()))


class RobosuiteEnv(VecEnv):
    def __init__(self, name: str, config: EnvConfig):
        try:
            import robosuite  # noqa: F401  (fail here, with the install hint, not in a worker)
        except ImportError as err:
            raise MissingDependency(
                f"env.task: 'robosuite:{name}' needs robosuite: pip install 'q2real[robosuite]' && "
                "pip install --no-deps robosuite==1.5.2"
            ) from err
        if config.backend == "mjx":
            raise ConfigError(f"env.backend: 'robosuite:{name}' steps its own simulator; use backend=auto or mujoco")
        self.device = resolve_device(config.device)
        self.num_envs = config.num_envs
        self._name = name
        kwargs = DEFAULTS | dict(config.task_params)
        workers = max(1, min(config.num_envs, os.cpu_count() or 1))
        counts = [len(part) for part in np.array_split(np.arange(config.num_envs), workers)]
        context = multiprocessing.get_context("spawn")
        self._pipes, self._processes = [], []
        start = 0
        for count in counts:
            parent, child = context.Pipe()
            args = (name, kwargs, count, config.seed + start, child)
            process = context.Process(target=_worker, args=args, daemon=True, name=f"robosuite-{start}")
            process.start()
            child.close()  # the worker holds its end; a dead worker then reads as EOF here
            self._pipes.append(parent)
            self._processes.append(process)
            start += count
        self._counts = counts
        replies = [self._receive(pipe) for pipe in self._pipes]
        dims, (low, high) = replies[0]
        self.obs_names, self.obs_dims = TERMS, tuple(int(d) for d in dims)
        self.obs_dim = sum(self.obs_dims)
        self.action_dim = int(np.asarray(low).size)
        if not (np.allclose(low, -1) and np.allclose(high, 1)):
            raise ConfigError(f"env.task: 'robosuite:{name}': expected actions in [-1, 1], got [{low}, {high}]")
        self.action_scale = torch.ones(self.action_dim, device=self.device)
        self.action_offset = torch.zeros(self.action_dim, device=self.device)
        self.control_period = 1.0 / float(kwargs["control_freq"])

    def _receive(self, pipe):
        try:
            kind, payload = pipe.recv()
        except EOFError:
            kind, payload = "error", "the worker process exited (see its output above)"
        if kind == "error":
            self.close()
            raise RuntimeError(f"robosuite:{self._name} worker failed:\n{payload}")
        return payload

    def _tensor(self, array, dtype=torch.float32) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), dtype=dtype).to(self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        # robosuite seeds its envs at creation; a reset draws the next initial state of each env's stream.
        for pipe in self._pipes:
            pipe.send(("reset", None))
        return self._tensor(np.concatenate([self._receive(pipe) for pipe in self._pipes]))

    def step(self, action: torch.Tensor) -> StepResult:
        unit = self.check_action(action).cpu().double().numpy()
        start = 0
        for pipe, count in zip(self._pipes, self._counts, strict=True):
            pipe.send(("step", unit[start : start + count]))
            start += count
        parts = [self._receive(pipe) for pipe in self._pipes]
        obs, next_obs, reward, truncated, success = (np.concatenate(column) for column in zip(*parts, strict=True))
        return StepResult(
            obs=self._tensor(obs),
            next_obs=self._tensor(next_obs),
            reward=self._tensor(reward),
            terminated=torch.zeros(self.num_envs, dtype=torch.bool, device=self.device),
            truncated=self._tensor(truncated, torch.bool),
            cost=torch.zeros(self.num_envs, device=self.device),
            info={"success": self._tensor(success, torch.bool)},
        )

    def close(self) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        for process in self._processes:
            process.join(5)
            if process.is_alive():
                process.kill()
        self._pipes, self._processes = [], []
