"""The one off-policy training loop: collect from N envs, store, update, call back.

Every learner (SAC, TD3, DDPG, FlashSAC, and the variants built on them) runs through `Trainer`.
What varies between them lives in the agent (`ActorCritic` pieces) or in callbacks; the loop owns
only ordering: act -> step -> guard -> store -> update -> callbacks.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from q2real.agents.common.actor_critic import ActorCritic
from q2real.agents.common.checkpoint import CHECKPOINT, check_config, check_shapes, load_checkpoint, save_checkpoint
from q2real.agents.common.episodes import EpisodeTracker
from q2real.agents.common.guard import check_finite, parameters_of
from q2real.agents.common.metrics import MetricLogger
from q2real.agents.common.progress import Progress
from q2real.agents.common.replay import ReplayStorage
from q2real.agents.common.run_dir import LogConfig, RunDir
from q2real.agents.common.samplers import SamplerConfig, make_sampler
from q2real.agents.flashsac import FlashSACConfig
from q2real.agents.pql import ParallelLearners, PQLConfig
from q2real.agents.sac import SAC, SACConfig
from q2real.agents.td3 import TD3, DDPGConfig, TD3Config
from q2real.configs.loader import to_dict
from q2real.sim import EnvConfig, VecEnv, make

ALGORITHMS: dict[str, type[ActorCritic]] = {"sac": SAC, "td3": TD3, "ddpg": TD3, "flashsac": SAC}
# Agent settings that decide which tensors a learner holds and their shapes; a checkpoint only fits a
# run that agrees on them (keys a section lacks, such as SAC's target_actor, are skipped).
AGENT_SHAPE_KEYS = (
    "network",
    "actor_hidden",
    "critic_hidden",
    "num_critics",
    "critic_head",
    "num_atoms",
    "noise_repeat",
    "target_actor",
)


@dataclass
class TrainConfig:
    env: EnvConfig = field(default_factory=lambda: EnvConfig(task="pendulum_swingup", num_envs=4))
    log: LogConfig = field(default_factory=lambda: LogConfig(interval_steps=5_000))
    algo: Literal["sac", "td3", "ddpg", "flashsac"] = "sac"
    """Which learner; its settings are the section of the same name."""
    sac: SACConfig = field(default_factory=SACConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    ddpg: DDPGConfig = field(default_factory=DDPGConfig)
    flashsac: FlashSACConfig = field(default_factory=FlashSACConfig)
    total_steps: int = 50_000
    """Env steps summed over all envs."""
    warmup_steps: int = 2_000
    """Env steps of uniform random actions before learning starts."""
    updates_per_step: float = 1.0
    """Gradient updates per vectorized env step (may be fractional)."""
    replay_capacity: int = 1_000_000
    """Transitions kept, over all envs."""
    eval_every: int = 5_000
    """Env steps between deterministic evaluations (0 = only at the end)."""
    eval_envs: int = 10
    """Evaluation episodes, run in parallel, one per env, on envs seeded apart from training."""
    checkpoint_every: int = 10_000
    stop_return: float | None = None
    """Stop early once the evaluation mean return reaches this."""
    threads: int = 0
    """torch CPU threads (0 = leave torch's default)."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """Replay sampling: uniform, prioritized (PER) or dspear (D-SPEAR's dual-stream prioritized replay)."""
    pql: PQLConfig = field(default_factory=PQLConfig)
    """Parallel Q-Learning: critic and policy learners in their own processes, concurrent with collection."""

    @property
    def agent(self):
        return getattr(self, self.algo)

    def validate(self) -> None:
        for key in ("total_steps", "eval_envs"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: expected >= 1, got {getattr(self, key)}")
        for key in ("warmup_steps", "eval_every", "checkpoint_every", "threads"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}: expected >= 0, got {getattr(self, key)}")
        if not 0 < self.updates_per_step < math.inf:
            raise ValueError(f"updates_per_step: expected > 0 and finite, got {self.updates_per_step}")
        if self.replay_capacity < max(1, self.env.num_envs):
            raise ValueError(
                f"replay_capacity: expected >= env.num_envs ({self.env.num_envs}) so one vectorized step fits, "
                f"got {self.replay_capacity}"
            )
        if self.stop_return is not None and math.isnan(self.stop_return):
            raise ValueError("stop_return: expected a number or null, got nan")
        self.log.validate()
        self.agent.validate(self.algo)
        self.pql.validate()
        self.sampler.validate()
        if self.pql.enabled and self.sampler.kind != "uniform":
            raise ValueError("sampler.kind: PQL learners sample uniformly; prioritized replay needs pql.enabled=false")
        if self.sampler.kind == "dspear" and self.sampler.critic_stream and self.agent.critic_head != "scalar":
            raise ValueError(f"sampler.kind=dspear: its Huber critic loss needs {self.algo}.critic_head=scalar")


class StopTraining(Exception):
    """Raised by a callback to end training early (the loop still evaluates and checkpoints)."""


class Callback:
    """Hooks into the loop; override what you need."""

    def on_start(self, trainer: Trainer) -> None: ...

    def on_iteration(self, trainer: Trainer) -> None: ...

    def on_end(self, trainer: Trainer) -> None: ...


def build_agent(config: TrainConfig, env: VecEnv) -> ActorCritic:
    """The configured learner for `env`'s spaces, sized for the training env count (`config.env.num_envs`),
    since per-env exploration and return-scale state are part of its checkpoint."""
    agent_config = config.agent
    if config.sampler.kind == "dspear" and config.sampler.critic_stream:
        agent_config = dataclasses.replace(agent_config, huber=True)  # D-SPEAR's critic stream: Huber TD loss
    return ALGORITHMS[config.algo](agent_config, env.obs_dim, env.action_dim, config.env.num_envs, env.device)


def check_agent_checkpoint(
    path: Path, state: dict, config: TrainConfig, agent: ActorCritic, extra_keys: Sequence[str] = ()
) -> None:
    """Refuse a checkpoint of another algorithm, task, network or observation/action size (or of other
    `extra_keys`), naming the first setting or tensor that differs, before `load_state_dict` fails
    with a bare traceback."""
    keys = ["algo", "env.task", *extra_keys, *(f"{config.algo}.{key}" for key in AGENT_SHAPE_KEYS)]
    check_config(path, state.get("config", {}), to_dict(config), keys)
    spaces = {"obs_dim": agent.obs_dim, "action_dim": agent.action_dim}
    check_config(path, state.get("spaces", {}), spaces, spaces)
    check_shapes(path, "agent", state["agent"], agent.state_dict())


@torch.no_grad()
def evaluate(policy: Callable[[torch.Tensor], torch.Tensor], env: VecEnv, seed: int) -> torch.Tensor:
    """Return of the first episode of every env under `policy` (one episode per env)."""
    obs = env.reset(seed=seed)
    returns = torch.zeros(env.num_envs, device=env.device)
    finished = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
    while not bool(finished.all()):
        result = env.step(policy(obs))
        returns += torch.where(finished, 0.0, result.reward)
        finished |= result.done
        obs = result.obs
    return returns


class Trainer:
    """Owns the env, agent, replay and counters; `run()` trains to `total_steps` or an early stop."""

    def __init__(self, config: TrainConfig, callbacks: Sequence[Callback] = (), resume: Path | None = None):
        config.validate()
        self.config = config
        self._torch_threads = torch.get_num_threads()  # restored after the run: the setting is process-wide
        if config.threads:
            torch.set_num_threads(config.threads)
        elif config.pql.enabled:
            torch.set_num_threads(1)  # the learner processes need the cores; idle OpenMP workers spin
        torch.manual_seed(config.env.seed)
        self.env = make(config.env)
        self.eval_env = make(dataclasses.replace(config.env, num_envs=config.eval_envs, seed=config.env.seed + 10_000))
        self.agent = build_agent(config, self.env)
        self.replay = ReplayStorage(
            config.replay_capacity, self.env.num_envs, self.env.obs_dim, self.env.action_dim, self.env.device
        )
        self.sampler = make_sampler(config.sampler, self.replay)
        self.episodes = EpisodeTracker(self.env.num_envs, self.env.device)
        self.step = self.iteration = 0
        self._update_credit = 0.0
        self._metric_sums: dict[str, torch.Tensor] = {}
        self._metric_count = 0
        self.last_checkpoint: Path | None = None
        self.last_eval: float | None = None
        self.parallel: ParallelLearners | None = None
        self.obs = self.env.reset(seed=config.env.seed)
        elapsed = 0.0
        if resume is not None:
            try:
                elapsed = self._load(resume / CHECKPOINT)
            except BaseException:
                self.env.close()
                self.eval_env.close()
                raise
        self.run_dir = RunDir(config, config.log, config.env.task, resume=resume)
        self.path = self.run_dir.path
        self.logger = MetricLogger(self.run_dir, config.log, elapsed=elapsed)
        builtin = [LogCallback(), EvalCallback(), CheckpointCallback()]
        self.callbacks = [*builtin, *callbacks]

    # --- one iteration -----------------------------------------------------------------------------
    def collect(self) -> None:
        env, agent = self.env, self.agent
        if self.step < self.config.warmup_steps:
            action = torch.rand(env.num_envs, env.action_dim, device=env.device) * 2 - 1
        else:
            action = agent.act(self.obs)
        result = env.step(action)
        check_finite(
            {"env output next_obs": result.next_obs, "env output reward": result.reward},
            self.step,
            self.last_checkpoint,
        )
        self.replay.add(self.obs, action, result)
        self.sampler.on_add(self.replay)
        agent.observe(result)
        self.episodes.update(result)
        self.obs = result.obs
        self.step += env.num_envs
        self.iteration += 1

    def learn(self) -> None:
        if self.step < self.config.warmup_steps:
            return
        self._update_credit += self.config.updates_per_step
        while self._update_credit >= 1.0:
            self._update_credit -= 1.0
            metrics = self.update()
            check_finite(metrics, self.step, self.last_checkpoint)
            for key, value in metrics.items():
                self._metric_sums[key] = self._metric_sums.get(key, 0.0) + value
            self._metric_count += 1

    def update(self) -> dict[str, torch.Tensor]:
        """One critic update on the sampler's critic batch (its TD errors go back to the sampler), and an
        actor update when due, on the sampler's actor batch (or the same one)."""
        agent, sampler, replay, cfg = self.agent, self.sampler, self.replay, self.config.agent
        batch = sampler.sample(replay, cfg.batch_size, cfg.n_step, cfg.gamma)
        metrics = agent.critic_update(batch)
        sampler.update(batch, agent.last_td_abs)
        if agent.actor_due():
            actor_batch = sampler.sample_actor(replay, cfg.batch_size, cfg.n_step, cfg.gamma) or batch
            metrics.update(agent.actor_update(actor_batch.obs))
        return metrics | sampler.metrics()

    def pop_update_metrics(self) -> dict[str, float]:
        if self.parallel is not None:
            return self.parallel.pop_metrics()
        if not self._metric_count:
            return {}
        means = {k: float(v) / self._metric_count for k, v in self._metric_sums.items()}
        self._metric_sums, self._metric_count = {}, 0
        return means

    def run(self) -> Path:
        iterations = math.ceil(self.config.total_steps / self.env.num_envs)
        try:
            if self.config.pql.enabled:
                self.parallel = ParallelLearners(self).start()
            for callback in self.callbacks:
                callback.on_start(self)
            try:
                while self.iteration < iterations:
                    self.collect()
                    if self.parallel is not None:
                        self.parallel.after_collect()
                    else:
                        self.learn()
                    for callback in self.callbacks:
                        callback.on_iteration(self)
            except StopTraining:
                pass
            for callback in self.callbacks:
                callback.on_end(self)
        except KeyboardInterrupt:
            self.save_checkpoint()
            raise
        finally:
            if self.parallel is not None:
                self.parallel.stop()
            torch.set_num_threads(self._torch_threads)
            self.logger.close()
            self.env.close()
            self.eval_env.close()
        return self.path

    # --- evaluation and checkpoints --------------------------------------------------------------------
    def evaluate(self) -> float:
        returns = evaluate(
            lambda obs: self.agent.act(obs, deterministic=True), self.eval_env, self.config.env.seed + 10_000
        )
        self.last_eval = float(returns.mean())
        return self.last_eval

    def state_dict(self) -> dict:
        agent = self.agent
        return {
            "format": 1,
            "config": to_dict(self.config),
            "spaces": {"obs_dim": self.env.obs_dim, "action_dim": self.env.action_dim},
            "step": self.step,
            "iteration": self.iteration,
            "updates": agent.updates,
            "update_credit": self._update_credit,
            "elapsed": self.logger.elapsed,
            "agent": agent.state_dict(),
            "agent_extra": agent.extra_state(),
            "optimizers": {name: opt.state_dict() for name, opt in agent.optimizers().items()},
            "replay": self.replay.state_dict(),
            "sampler": self.sampler.state_dict(),
            "env": self.env.state_dict(),
            "obs": self.obs,
            "episodes": self.episodes.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all()},
        }

    def save_checkpoint(self) -> Path:
        """Write checkpoint.pt atomically, refusing to overwrite a good checkpoint with non-finite weights.
        Parallel learners pause meanwhile and hand over their optimizer states."""
        if self.parallel is None:
            return self._save_checkpoint()
        with self.parallel.paused():
            return self._save_checkpoint()

    def _save_checkpoint(self) -> Path:
        check_finite(parameters_of(self.agent, "parameter"), self.step, self.last_checkpoint)
        path = self.path / CHECKPOINT
        save_checkpoint(path, self.state_dict())
        self.last_checkpoint = path
        return path

    def _load(self, path: Path) -> float:
        state = load_checkpoint(path, self.env.device)
        self._check_fits(path, state)
        agent = self.agent
        agent.load_state_dict(state["agent"])
        agent.load_extra_state(state["agent_extra"])
        for name, opt in agent.optimizers().items():
            opt.load_state_dict(state["optimizers"][name])
        agent.updates = int(state["updates"])
        self.replay.load_state_dict(state["replay"])
        self.sampler.load_state_dict(state.get("sampler", {}))
        if state["env"] is not None and self.env.state_dict() is not None:
            self.env.load_state_dict(state["env"])
            self.obs = state["obs"].to(self.env.device)
        self.episodes.load_state_dict(state["episodes"])
        self.step, self.iteration = int(state["step"]), int(state["iteration"])
        self._update_credit = float(state["update_credit"])
        torch.set_rng_state(state["rng"]["torch"].cpu())
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["rng"]["cuda"]])
        self.last_checkpoint = path
        return float(state["elapsed"])

    def _check_fits(self, path: Path, state: dict) -> None:
        """Refuse a checkpoint this run cannot continue, naming the first setting or tensor that differs."""
        if state.get("format") != 1:
            raise ValueError(f"{path}: checkpoint format {state.get('format')!r}; this q2real reads format 1")
        check_agent_checkpoint(path, state, self.config, self.agent, ("env.num_envs", "replay_capacity"))
        check_shapes(path, "agent_extra", state["agent_extra"], self.agent.extra_state())
        check_shapes(path, "replay", state["replay"]["data"], self.replay.data)
        check_shapes(path, "episodes", state["episodes"], self.episodes.state_dict())
        sampler = self.sampler.state_dict()
        if state.get("sampler") and sampler:  # a prioritized sampler resuming a uniform run starts fresh
            check_shapes(path, "sampler", state["sampler"], sampler)


class Every:
    """True once each time the env-step counter passes a multiple of `interval` (never for interval 0),
    so schedules stay aligned across resumes."""

    def __init__(self, interval: int, step: int):
        self.interval = interval
        self.next = (step // interval + 1) * interval if interval else math.inf

    def due(self, step: int) -> bool:
        if step < self.next:
            return False
        self.next += self.interval
        return True


class LogCallback(Callback):
    """Metrics every `log.interval_steps` env steps, and the progress bar."""

    def on_start(self, trainer: Trainer) -> None:
        cfg = trainer.config
        total = math.ceil(cfg.total_steps / trainer.env.num_envs) * trainer.env.num_envs
        self.progress = Progress(total, f"{cfg.algo} on {cfg.env.task}")
        self.progress.done = trainer.step
        self._last_step, self._last_time, self._last_updates = trainer.step, time.monotonic(), trainer.agent.updates
        self._schedule = Every(cfg.log.interval_steps, trainer.step)

    def on_iteration(self, trainer: Trainer) -> None:
        shown = self.log(trainer) if self._schedule.due(trainer.step) else {}
        self.progress.update(trainer.env.num_envs, **shown)

    def log(self, trainer: Trainer) -> dict[str, float]:
        now = time.monotonic()
        seconds = max(now - self._last_time, 1e-9)
        metrics = {
            "env_steps_per_s": (trainer.step - self._last_step) / seconds,
            "updates_per_s": (trainer.agent.updates - self._last_updates) / seconds,
            **trainer.episodes.pop(),
            **trainer.pop_update_metrics(),
        }
        self._last_step, self._last_time, self._last_updates = trainer.step, now, trainer.agent.updates
        trainer.logger.log(trainer.step, metrics)
        shown = {k: metrics[k] for k in ("episode_return",) if k in metrics}
        if trainer.last_eval is not None:
            shown["eval"] = trainer.last_eval
        return shown

    def on_end(self, trainer: Trainer) -> None:
        if trainer.step > self._last_step:
            self.log(trainer)
        self.progress.close()


class EvalCallback(Callback):
    """Deterministic evaluation every `eval_every` env steps and at the end; early stop on `stop_return`."""

    def on_start(self, trainer: Trainer) -> None:
        self._schedule = Every(trainer.config.eval_every, trainer.step)
        self._done_at: int | None = None

    def on_iteration(self, trainer: Trainer) -> None:
        if self._schedule.due(trainer.step):
            self._evaluate(trainer)

    def _evaluate(self, trainer: Trainer) -> None:
        self._done_at = trainer.step
        value = trainer.evaluate()
        trainer.logger.log(trainer.step, {"eval_return": value})
        stop = trainer.config.stop_return
        if stop is not None and value >= stop:
            raise StopTraining

    def on_end(self, trainer: Trainer) -> None:
        if self._done_at == trainer.step:
            return
        try:
            self._evaluate(trainer)
        except StopTraining:
            pass


class CheckpointCallback(Callback):
    """Atomic checkpoint every `checkpoint_every` env steps and at the end."""

    def on_start(self, trainer: Trainer) -> None:
        self._schedule = Every(trainer.config.checkpoint_every, trainer.step)

    def on_iteration(self, trainer: Trainer) -> None:
        if self._schedule.due(trainer.step):
            trainer.save_checkpoint()

    def on_end(self, trainer: Trainer) -> None:
        trainer.save_checkpoint()


def train(config: TrainConfig, callbacks: Sequence[Callback] = ()) -> Trainer:
    """Train from scratch; returns the finished trainer (its `path` is the run directory)."""
    trainer = Trainer(config, callbacks)
    trainer.run()
    return trainer


def resume(run_dir: Path, config: TrainConfig, callbacks: Sequence[Callback] = ()) -> Trainer:
    """Continue a run from its checkpoint.pt, appending to its run directory."""
    trainer = Trainer(config, callbacks, resume=Path(run_dir))
    trainer.run()
    return trainer
