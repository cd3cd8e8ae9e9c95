"""Residual RL and RL from demonstrations on the shared training loop.

`ResidualTrainer` is `q2real.agents.train.Trainer` with four of its pieces replaced, not a second
loop: the env (observations extended with the frozen base's action), the learner (`ResidualSAC`),
the sampler (half of every batch from the demonstrations) and the warm-up (the base policy with the
residual's exploration noise instead of uniform random actions, which would throw away what the base
knows). A run directory holds `config.yaml` with a `residual:` section beside the SAC one; the
demonstrations and the base are read again on resume, the rest comes from the checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from q2real.agents.callbacks import Callback
from q2real.agents.common.actor_critic import ActorCritic
from q2real.agents.common.samplers import UniformSampler
from q2real.agents.config import TrainConfig
from q2real.agents.sac import SACConfig
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
        super().__init__(config, callbacks, resume)

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
        return ResidualSAC(
            config.agent, env.obs_dim, env.action_dim, config.env.num_envs, env.device, config.residual, self.base_dim
        )

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
