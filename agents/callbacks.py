"""What the training loop calls back into: logging, evaluation, checkpoints and early stopping, each on
its own env-step schedule, plus the deterministic evaluation they use.

Callbacks see the whole loop (as Brax's `progress_fn` and SB3's callbacks see theirs) through one
declared protocol, `TrainingLoop`, which both loops implement: `Trainer` (replay learners) and
`StreamTrainer` (streaming learners). A new callback plugs in without either loop changing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Protocol

import torch

from q2real.agents.common.actor_critic import ActorCritic
from q2real.agents.common.episodes import EpisodeTracker
from q2real.agents.common.metrics import MetricLogger
from q2real.agents.common.progress import Progress
from q2real.agents.common.run_dir import LogConfig
from q2real.contracts.chunks import ChunkQueue, ChunkSpec
from q2real.sim import StepResult, VecEnv


class EnvName(Protocol):
    @property
    def task(self) -> str: ...


class LoopConfig(Protocol):
    """What every training job's config declares for the loop (`TrainConfig`, `StreamTrainConfig`)."""

    @property
    def algo(self) -> str: ...
    @property
    def env(self) -> EnvName: ...
    @property
    def log(self) -> LogConfig: ...
    @property
    def total_steps(self) -> int: ...
    @property
    def eval_every(self) -> int: ...
    @property
    def checkpoint_every(self) -> int: ...
    @property
    def stop_return(self) -> float | None: ...


class Learner(Protocol):
    @property
    def updates(self) -> int:
        """Gradient updates taken (the loop's updates/s)."""
        ...


class TrainingLoop(Protocol):
    """What a training loop shows its callbacks."""

    @property
    def config(self) -> LoopConfig: ...
    @property
    def path(self) -> Path:
        """The run directory."""
        ...

    @property
    def agent(self) -> Learner: ...
    @property
    def step(self) -> int:
        """Env steps taken, over all envs (and ranks)."""
        ...

    @property
    def envs_per_iteration(self) -> int: ...
    @property
    def episodes(self) -> EpisodeTracker: ...
    @property
    def logger(self) -> MetricLogger: ...
    @property
    def last_eval(self) -> float | None: ...
    @property
    def last_eval_success(self) -> float | None: ...
    @property
    def last_eval_cost(self) -> float | None: ...
    @property
    def randomization_strength(self) -> float | None:
        """Where a curriculum grows the training envs' randomization, its share of the full ranges now."""
        ...

    def evaluate(self, watch: Watch | None = None) -> float: ...
    def pop_update_metrics(self) -> dict[str, float]: ...
    def save_checkpoint(self) -> Path: ...


class StopTraining(Exception):
    """Raised by a callback to end training early (the loop still evaluates and checkpoints)."""


class Callback:
    """Hooks into the loop; override what you need."""

    def on_start(self, trainer: TrainingLoop) -> None: ...

    def on_iteration(self, trainer: TrainingLoop) -> None: ...

    def on_end(self, trainer: TrainingLoop) -> None: ...


class ChunkExecutor:
    """A chunk policy run tick by tick on `env`'s envs through the robot's queue: `predict(obs)` gives
    (N, size * action_dim) actions, the executor one action per env and tick."""

    def __init__(self, predict: Callable[[torch.Tensor], torch.Tensor], spec: ChunkSpec, env: VecEnv):
        self.predict, self.num_envs, self.action_dim = predict, env.num_envs, env.action_dim
        self.queue = ChunkQueue(spec, env.num_envs, env.action_dim, torch, device=env.device)

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        # Every env predicts on every tick and the queue keeps the due envs' rows: one batched forward,
        # no branch on which envs are due, so nothing is read back from the device.
        return self.queue.act(self.predict(obs).view(self.num_envs, -1, self.action_dim))

    def clear(self, done: torch.Tensor) -> None:
        """Start the ended episodes' envs on a fresh chunk."""
        self.queue.clear(done)


def deterministic_policy(
    agent: ActorCritic, env: VecEnv, averaged: bool = True
) -> Callable[[torch.Tensor], torch.Tensor]:
    """`agent`'s deterministic actions in [-1, 1] for `env`, chunks executed as the bundle will run them
    (`averaged=False`: the online actor's, where the policy is an averaged copy)."""

    def predict(obs: torch.Tensor) -> torch.Tensor:
        return agent.act(obs, deterministic=True, averaged=averaged).clamp(-1.0, 1.0)

    spec = agent.config.chunk.spec()
    return ChunkExecutor(predict, spec, env) if spec.size > 1 else predict


Watch = Callable[[VecEnv, StepResult], None]
"""Called after every evaluation step with the env and the step's result (a film records its frames)."""


@torch.no_grad()
def evaluate(
    policy: Callable[[torch.Tensor], torch.Tensor], env: VecEnv, seed: int, watch: Watch | None = None
) -> torch.Tensor:
    """Return of the first episode of every env under `policy` (one episode per env; what a policy
    with per-episode state does after its env's episode ended is never counted)."""
    return evaluate_episodes(policy, env, seed, watch)[0]


class Episodes(NamedTuple):
    """One evaluation episode per env."""

    returns: torch.Tensor
    success: torch.Tensor | None
    """Whether the episode ever passed the task's success test (None for tasks without one)."""
    cost: torch.Tensor
    """The episode's summed safety cost."""


@torch.no_grad()
def evaluate_episodes(
    policy: Callable[[torch.Tensor], torch.Tensor], env: VecEnv, seed: int, watch: Watch | None = None
) -> Episodes:
    """As `evaluate`, with each episode's success and cost."""
    obs = env.reset(seed=seed)
    returns = torch.zeros(env.num_envs, device=env.device)
    cost = torch.zeros(env.num_envs, device=env.device)
    finished = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
    success: torch.Tensor | None = None
    while not bool(finished.all()):
        result = env.step(policy(obs))
        returns += torch.where(finished, 0.0, result.reward)
        cost += torch.where(finished, 0.0, result.cost)
        flag = result.info.get("success")
        if flag is not None:
            success = (flag.bool() & ~finished) | (success if success is not None else False)
        finished |= result.done
        obs = result.obs
        if watch is not None:
            watch(env, result)
    return Episodes(returns, success, cost)


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

    def on_start(self, trainer: TrainingLoop) -> None:
        cfg = trainer.config
        total = math.ceil(cfg.total_steps / trainer.envs_per_iteration) * trainer.envs_per_iteration
        self.progress = Progress(total, f"{cfg.algo} on {cfg.env.task}")
        self.progress.done = trainer.step
        self._last_step, self._last_time, self._last_updates = trainer.step, time.monotonic(), trainer.agent.updates
        self._schedule = Every(cfg.log.interval_steps, trainer.step)

    def on_iteration(self, trainer: TrainingLoop) -> None:
        shown = self.log(trainer) if self._schedule.due(trainer.step) else {}
        self.progress.update(trainer.envs_per_iteration, **shown)

    def log(self, trainer: TrainingLoop) -> dict[str, float]:
        now = time.monotonic()
        seconds = max(now - self._last_time, 1e-9)
        metrics = {
            "env_steps_per_s": (trainer.step - self._last_step) / seconds,
            "updates_per_s": (trainer.agent.updates - self._last_updates) / seconds,
            "torch_threads": torch.get_num_threads(),
            **trainer.episodes.pop(),
            **trainer.pop_update_metrics(),
        }
        if trainer.randomization_strength is not None:
            metrics["randomization_strength"] = trainer.randomization_strength
        self._last_step, self._last_time, self._last_updates = trainer.step, now, trainer.agent.updates
        trainer.logger.log(trainer.step, metrics)
        shown = {k: metrics[k] for k in ("episode_return", "randomization_strength") if k in metrics}
        if trainer.last_eval is not None:
            shown["eval"] = trainer.last_eval
        return shown

    def on_end(self, trainer: TrainingLoop) -> None:
        if trainer.step > self._last_step:
            self.log(trainer)
        self.progress.close()


class EvalCallback(Callback):
    """Deterministic evaluation every `eval_every` env steps and at the end; early stop on `stop_return`.
    With `log.video`, each evaluation's first episode is filmed to `videos/step_<N>.mp4`: its frames are
    recorded as it runs and rendered once it is over, so training pays only at evaluations."""

    def on_start(self, trainer: TrainingLoop) -> None:
        self._schedule = Every(trainer.config.eval_every, trainer.step)
        self._done_at: int | None = None
        if trainer.config.log.video:
            from q2real.sim.filming import check_filming  # rendering's modules, for runs that film only

            check_filming(trainer.config.env.task)  # now, not at the first evaluation an hour in

    def on_iteration(self, trainer: TrainingLoop) -> None:
        if self._schedule.due(trainer.step):
            self._evaluate(trainer)

    def _evaluate(self, trainer: TrainingLoop) -> None:
        self._done_at = trainer.step
        config, film = trainer.config, None
        if config.log.video:
            from q2real.sim.filming import VIDEO_SECONDS, EpisodeFilm

            film = EpisodeFilm(f"{config.algo} on {config.env.task}, step {trainer.step}", seconds=VIDEO_SECONDS)
        value = trainer.evaluate(film)
        if film is not None:
            film.write(trainer.path / "videos" / f"step_{trainer.step}.mp4")
        success = {"eval_success": trainer.last_eval_success} if trainer.last_eval_success is not None else {}
        assert trainer.last_eval_cost is not None, "evaluate() sets it"
        trainer.logger.log(trainer.step, {"eval_return": value, **success, "eval_cost": trainer.last_eval_cost})
        stop = trainer.config.stop_return
        if stop is not None and value >= stop:
            raise StopTraining

    def on_end(self, trainer: TrainingLoop) -> None:
        if self._done_at == trainer.step:
            return
        try:
            self._evaluate(trainer)
        except StopTraining:
            pass


class CheckpointCallback(Callback):
    """Atomic checkpoint every `checkpoint_every` env steps and at the end."""

    def on_start(self, trainer: TrainingLoop) -> None:
        self._schedule = Every(trainer.config.checkpoint_every, trainer.step)

    def on_iteration(self, trainer: TrainingLoop) -> None:
        if self._schedule.due(trainer.step):
            trainer.save_checkpoint()

    def on_end(self, trainer: TrainingLoop) -> None:
        trainer.save_checkpoint()
