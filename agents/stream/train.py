"""The streaming loop: one env, one transition, one update, as it happens (`q2real train algo=stream_ac`).

Not the off-policy `Trainer`: there is no replay, no warm-up of random actions and no update ratio,
so the loop is act -> step -> guard -> learn -> callbacks. Everything around it is shared: the same
callbacks (metrics, progress bar, evaluation, atomic checkpoints, early stop), run directory, logger
and non-finite guard, and the same envs (q2real tasks and `gymnasium:` ones).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from q2real.agents.callbacks import (
    Callback,
    CheckpointCallback,
    EvalCallback,
    LogCallback,
    StopTraining,
    Watch,
    evaluate_episodes,
)
from q2real.agents.common.checkpoint import CHECKPOINT, CheckpointError, check_shapes, load_checkpoint, save_checkpoint
from q2real.agents.common.episodes import EpisodeTracker
from q2real.agents.common.guard import FiniteFlags, check_finite, parameters_of
from q2real.agents.common.metrics import MetricLogger
from q2real.agents.common.run_dir import LogConfig, RunDir
from q2real.agents.stream.stream_ac import StreamAC, StreamACConfig
from q2real.configs.loader import ConfigError, to_dict
from q2real.sim import EnvConfig, make

FORMAT = 1


@dataclass
class StreamTrainConfig:
    env: EnvConfig = field(default_factory=lambda: EnvConfig(task="pendulum_swingup", num_envs=1))
    """The task learned on: one env, one stream of transitions (`num_envs` must be 1)."""
    log: LogConfig = field(default_factory=lambda: LogConfig(interval_steps=5_000))
    """Where the run directory goes and how metrics are logged."""
    algo: Literal["stream_ac"] = "stream_ac"
    """The streaming learner; `algo=stream_ac` is what selects this job in `q2real train`."""
    stream_ac: StreamACConfig = field(default_factory=StreamACConfig)
    """Stream AC(lambda)'s settings."""
    total_steps: int = 200_000
    """Transitions to learn from, each once."""
    eval_every: int = 10_000
    """Env steps between deterministic evaluations (0 = only at the end)."""
    eval_envs: int = 10
    """Evaluation episodes, run in parallel, one per env, on envs seeded apart from training."""
    checkpoint_every: int = 50_000
    """Env steps between checkpoints, the points `--resume` continues from (0 = only at the end)."""
    stop_return: float | None = None
    """Stop early once the evaluation mean return reaches this."""
    threads: int = 1
    """torch CPU threads: a batch of one gains nothing from more."""

    def validate(self) -> None:
        if self.env.num_envs != 1:
            raise ConfigError(f"env.num_envs: a streaming learner sees one stream, expected 1, got {self.env.num_envs}")
        for key in ("total_steps", "eval_envs", "threads"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}: expected >= 1, got {getattr(self, key)}")
        for key in ("eval_every", "checkpoint_every"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: expected >= 0, got {getattr(self, key)}")
        if self.stop_return is not None and math.isnan(self.stop_return):
            raise ConfigError("stop_return: expected a number or null, got nan")
        for holds, key, expected in self.stream_ac.checks():
            if not holds:
                raise ConfigError(f"stream_ac.{key}: expected {expected}, got {getattr(self.stream_ac, key)!r}")
        self.log.validate()


class StreamTrainer:
    """Owns the env, the streaming agent and the counters; `run()` learns for `total_steps` transitions."""

    def __init__(self, config: StreamTrainConfig, callbacks: Sequence[Callback] = (), resume: Path | None = None):
        config.validate()
        self.config = config
        self._torch_threads = torch.get_num_threads()
        torch.set_num_threads(config.threads)
        torch.manual_seed(config.env.seed)
        self.env = make(config.env)
        self.eval_env = make(dataclasses.replace(config.env, num_envs=config.eval_envs, seed=config.env.seed + 10_000))
        self.env.require_policy_obs("a streaming learner")
        self.agent = StreamAC(config.stream_ac, self.env.obs_dim, self.env.action_dim, self.env.device)
        self.episodes = EpisodeTracker(1, self.env.device, self.env.reward_terms)
        self.finite = FiniteFlags()
        self.step = 0
        self.envs_per_iteration = 1
        self.last_checkpoint: Path | None = None
        self.last_eval: float | None = None
        self.last_eval_success: float | None = None
        self.last_eval_cost: float | None = None
        self.randomization_strength: float | None = None  # no curriculum: the env's ranges throughout
        self._metric_sums: dict[str, torch.Tensor] = {}
        self._metric_count = 0
        self.obs = self.env.reset(seed=config.env.seed)
        elapsed = 0.0
        if resume is not None:
            try:
                elapsed = self._restore(resume / CHECKPOINT)
            except BaseException:
                self.env.close()
                self.eval_env.close()
                raise
            self.last_checkpoint = resume / CHECKPOINT
        self.run_dir = RunDir(config, config.log, config.env.task, resume=resume)
        self.path = self.run_dir.path
        self.logger = MetricLogger(self.run_dir, config.log, elapsed=elapsed)
        self.callbacks = [LogCallback(), EvalCallback(), CheckpointCallback(), *callbacks]

    def run(self) -> Path:
        try:
            for callback in self.callbacks:
                callback.on_start(self)  # pyright: ignore[reportArgumentType]
            try:
                while self.step < self.config.total_steps:
                    self.collect_and_learn()
                    for callback in self.callbacks:
                        callback.on_iteration(self)  # pyright: ignore[reportArgumentType]
            except StopTraining:
                pass
            for callback in self.callbacks:
                callback.on_end(self)  # pyright: ignore[reportArgumentType]
        except KeyboardInterrupt:
            self.save_checkpoint()
            raise
        finally:
            torch.set_num_threads(self._torch_threads)
            self.logger.close()
            self.env.close()
            self.eval_env.close()
        return self.path

    def collect_and_learn(self) -> None:
        obs, agent = self.obs, self.agent
        action = agent.act(obs)
        result = self.env.step(action)
        self.finite.record({"env output next_obs": result.next_obs, "env output reward": result.reward}, self.step)
        agent.learn(obs, action, result.reward, result.next_obs, result.terminated, result.done)
        metrics = agent.metrics()
        self.finite.record(metrics, self.step)
        for key, value in metrics.items():
            total = self._metric_sums.get(key)
            self._metric_sums[key] = value if total is None else total + value
        self._metric_count += 1
        self.episodes.update(result)
        self.obs = result.obs
        self.step += 1

    # --- what the shared callbacks read --------------------------------------------------------------
    def pop_update_metrics(self) -> dict[str, float]:
        self.finite.check(self.last_checkpoint)
        values = {k: v / max(self._metric_count, 1) for k, v in self._metric_sums.items()}
        self._metric_sums, self._metric_count = {}, 0
        if not values:
            return {}
        return dict(zip(values, torch.stack(list(values.values())).tolist(), strict=True))

    def evaluate(self, watch: Watch | None = None) -> float:
        agent = self.agent
        returns, success, cost = evaluate_episodes(
            lambda obs: agent.act(obs, deterministic=True), self.eval_env, self.config.env.seed + 10_000, watch
        )
        self.last_eval = float(returns.mean())
        self.last_eval_cost = float(cost.mean())
        self.last_eval_success = float(success.float().mean()) if success is not None else None
        return self.last_eval

    def save_checkpoint(self) -> Path:
        self.finite.check(self.last_checkpoint)
        check_finite(parameters_of(self.agent, "parameter"), self.step, self.last_checkpoint)
        path = self.path / CHECKPOINT
        state = {
            "format": FORMAT,
            "config": to_dict(self.config),
            "spaces": {"obs_dim": self.env.obs_dim, "action_dim": self.env.action_dim},
            "step": self.step,
            "elapsed": self.logger.elapsed,
            "agent": self.agent.state_dict(),
            "traces": self.agent.optimizer_state(),
            "env": self.env.state_dict(),
            "obs": self.obs,
            "episodes": self.episodes.state_dict(),
            "rng": torch.get_rng_state(),
        }
        save_checkpoint(path, state)
        self.last_checkpoint = path
        return path

    def _restore(self, path: Path) -> float:
        state = load_checkpoint(path, self.env.device)
        if state.get("format") != FORMAT or state.get("config", {}).get("algo") != "stream_ac":
            raise CheckpointError(f"{path}: not a checkpoint of a stream_ac run")
        spaces = {"obs_dim": self.env.obs_dim, "action_dim": self.env.action_dim}
        if state["spaces"] != spaces:
            raise CheckpointError(f"{path}: spaces {state['spaces']}, this run {spaces}")
        check_shapes(path, "agent", state["agent"], self.agent.state_dict())
        self.agent.load_state_dict(state["agent"])
        self.agent.load_optimizer_state(state["traces"])
        if state["env"] is not None and self.env.state_dict() is not None:
            self.env.load_state_dict(state["env"])
            self.obs = state["obs"].to(self.env.device)
        self.episodes.load_state_dict(state["episodes"])
        self.step = int(state["step"])
        torch.set_rng_state(state["rng"].cpu())
        return float(state["elapsed"])
