"""Residual RL and RL from demonstrations on the shared training loop.

`ResidualTrainer` is `q2real.agents.train.Trainer` with four of its pieces replaced, not a second
loop: the env (observations extended with the frozen base's action), the learner (`ResidualSAC`),
the sampler (half of every batch from the demonstrations) and the warm-up (the base policy with the
residual's exploration noise instead of uniform random actions, which would throw away what the base
knows). A run directory holds `config.yaml` with a `residual:` section beside the SAC one; the
demonstrations and the base are read again on resume, the rest comes from the checkpoint.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from q2real.agents.algos.sac import SACConfig
from q2real.agents.callbacks import Callback, ChunkExecutor, TrainingLoop, evaluate_episodes
from q2real.agents.common.actor_critic import ActorCritic, Sizes
from q2real.agents.common.metrics import RETURNS, Panel
from q2real.agents.common.samplers import UniformSampler
from q2real.agents.config import TrainConfig
from q2real.agents.train import Trainer
from q2real.configs.loader import ConfigError
from q2real.residual.base_env import BaseActionEnv
from q2real.residual.bc import BCConfig, BCPolicy, load_bc
from q2real.residual.dataset import read_lerobot
from q2real.residual.demo_replay import DemoMixSampler, demo_storage
from q2real.residual.learner import ResidualConfig, ResidualSAC
from q2real.sim import EnvConfig, VecEnv, make
from q2real.sim.config import refuse_stepped_actions


@dataclass
class ResidualTrainConfig(TrainConfig):
    residual: ResidualConfig = field(default_factory=ResidualConfig)
    """The base policy, the demonstrations and the residual's bound and schedules."""

    def validate(self) -> None:
        super().validate()
        self.residual.validate()
        if self.algo != "sac":
            raise ValueError(f"algo: residual training runs SAC, got algo={self.algo}")
        if self.pql.enabled:
            raise ValueError("pql.enabled: residual training samples demonstrations in this process; set it false")
        if self.init_from is not None:
            raise ValueError("init_from: a residual run starts from its base policy (residual.base); set it null")
        if self.residual.demos and self.sampler.kind != "uniform":
            raise ValueError("sampler.kind: demonstrations are mixed into uniform batches; set sampler.kind=uniform")


class ResidualTrainer(Trainer):
    config: ResidualTrainConfig
    agent: ResidualSAC

    def __init__(self, config: ResidualTrainConfig, callbacks: Sequence[Callback] = (), resume: Path | None = None):
        config.validate()
        refuse_stepped_actions(config.env, "a residual over a cloned policy")
        settings = config.residual
        self.base: BCPolicy | None = None
        self.base_config: BCConfig | None = None
        if settings.base:
            self.base_config, self.base, _ = load_bc(settings.base)
            check_same_env(config.env, self.base_config.env, f"residual.base ({settings.base})")
            base_chunk, chunk = self.base_config.chunk, config.agent.chunk.size
            if base_chunk != chunk:
                raise ConfigError(
                    f"sac.chunk.size: the base predicts chunks of {base_chunk} and the residual corrects a whole "
                    f"chunk, so it must be {base_chunk}, got {chunk}"
                )
        self.base_eval: float | None = None
        """The base alone: mean return on the evaluation episodes (None: no base, or not yet scored)."""
        self.base_eval_success: float | None = None
        super().__init__(config, [BaseScore(), *callbacks] if self.base is not None else callbacks, resume)

    @property
    def base_dim(self) -> int:
        return self.base.action_dim * self.base.chunk if self.base is not None else 0

    def make_env(self, env_config: EnvConfig) -> VecEnv:
        env = make(env_config)
        return BaseActionEnv(env, self.base, self.base_dim) if self.base is not None else env

    def build_agent(self) -> ActorCritic:
        config = self.config
        assert isinstance(config.agent, SACConfig)
        env = self.env
        return ResidualSAC(config.agent, Sizes.of(env, config.env.num_envs), config.residual, self.base_dim)

    def make_sampler(self) -> UniformSampler:
        settings = self.config.residual
        if not settings.demos:
            return super().make_sampler()
        demos = read_lerobot(settings.demos)
        check_same_env(self.config.env, demos_env(demos, settings.demos), f"residual.demos ({settings.demos})")
        if settings.successful_only and demos.success is not None:
            demos = demos.select(np.flatnonzero(demos.episode_success()))
        if demos.obs.shape[1] + self.base_dim != self.env.obs_dim or demos.action.shape[1] != self.env.action_dim:
            raise ConfigError(f"residual.demos: {settings.demos} does not match env {self.config.env.task}'s spaces")
        extend = self.env.extend if isinstance(self.env, BaseActionEnv) else None
        self.demos = demo_storage(demos, self.env.device, extend)
        return DemoMixSampler(self.demos, settings.demo_fraction)

    def warmup_action(self) -> torch.Tensor:
        return self.policy_action() if self.base is not None else super().warmup_action()

    def curve_panels(self) -> tuple[Panel, ...]:
        """Returns and success rate, each with the base's score drawn across: where the residual stands."""
        returns = Panel(RETURNS.ylabel, RETURNS.keys, levels=("base_eval_return",))
        return returns, Panel("success rate", ("eval_success",), levels=("base_eval_success",))

    def score_base(self) -> None:
        """The frozen base alone on the evaluation episodes, logged as `base_eval_return` (and
        `base_eval_success`): the bar every evaluation of the residual is read against. A residual that
        ends below it should not replace its base."""
        base_dim = self.base_dim

        def predict(obs: torch.Tensor) -> torch.Tensor:
            return obs[..., -base_dim:]  # the base's action (chunk), as the eval env observed it

        spec = self.config.agent.chunk.spec()
        policy = ChunkExecutor(predict, spec, self.eval_env) if spec.size > 1 else predict
        returns, success, _ = evaluate_episodes(policy, self.eval_env, self.eval_seed)
        self.base_eval = float(returns.mean())
        self.base_eval_success = float(success.float().mean()) if success is not None else None
        scored = {"base_eval_return": self.base_eval}
        if self.base_eval_success is not None:
            scored["base_eval_success"] = self.base_eval_success
        self.logger.log(self.step, scored)

    def below_base(self) -> bool:
        """The last evaluation scored under the base alone: by success rate where the task has a success
        test (what a user of a manipulation skill reads), else by return."""
        if self.base_eval is None or self.last_eval is None:
            return False
        if self.base_eval_success is not None and self.last_eval_success is not None:
            return self.last_eval_success < self.base_eval_success
        return self.last_eval < self.base_eval


class BaseScore(Callback):
    """Scores the base alone before the residual's first step (on a resume too: the same episodes give the
    same score), so the console and the curves compare the residual with what it corrects."""

    def on_start(self, trainer: TrainingLoop) -> None:
        assert isinstance(trainer, ResidualTrainer)
        trainer.score_base()
        success = f", success {trainer.base_eval_success:.2f}" if trainer.base_eval_success is not None else ""
        print(
            f"base alone ({trainer.config.residual.base}) on the evaluation episodes: "
            f"mean return {trainer.base_eval:.1f}{success}",
            file=sys.stderr,
        )


def demos_env(demos, source: str) -> EnvConfig:
    if not demos.task:
        raise ConfigError(f"residual.demos: {source} does not say which task it was recorded on")
    return EnvConfig(task=demos.task, task_params=dict(demos.q2real.get("task_params", {})))


def check_same_env(env: EnvConfig, other: EnvConfig, what: str) -> None:
    """A base or demonstrations from another task, or from other task settings (a dense reward where
    the run is sparse), would teach the wrong thing silently; refuse them by name."""
    if other.task != env.task:
        raise ConfigError(f"{what}: made on task {other.task!r}, this run trains on env.task={env.task!r}")
    ours, theirs = dict(env.task_params), dict(other.task_params)
    differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if differ:
        key = differ[0]
        raise ConfigError(
            f"{what}: made with env.task_params.{key}={theirs.get(key)!r}, this run has {ours.get(key)!r}; "
            "record demonstrations (and clone the base) with the run's task settings"
        )
