"""Roll a fixed policy (uniform random or zero action) through a batched env and log what it earns.

Gives the baseline return a learner must beat and the env's end-to-end throughput, written to a
run directory exactly as training runs are.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from q2real.agents.common.episodes import EpisodeTracker
from q2real.agents.common.metrics import MetricLogger
from q2real.agents.common.progress import Progress
from q2real.agents.common.run_dir import LogConfig, RunDir
from q2real.configs.loader import ConfigError
from q2real.sim import EnvConfig, make


@dataclass
class RolloutConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    """The task rolled out on, and its envs."""
    log: LogConfig = field(default_factory=LogConfig)
    """Where the run directory goes and how often returns are logged."""
    policy: Literal["random", "zero"] = "random"
    """`random`: actions uniform in [-1, 1] (seeded by `env.seed`); `zero`: every action 0. A task's floor
    to compare a learner against."""
    total_steps: int = 200_000
    """Env steps summed over all envs."""


def rollout(config: RolloutConfig) -> Path:
    """Run the rollout; returns the run directory."""
    if config.total_steps < 1:
        raise ConfigError(f"total_steps: expected >= 1, got {config.total_steps}")
    config.log.validate()
    env = make(config.env)
    run = RunDir(config, config.log, config.env.task)
    logger = MetricLogger(run, config.log)
    episodes = EpisodeTracker(env.num_envs, env.device, env.reward_terms)
    gen = torch.Generator(device=env.device).manual_seed(config.env.seed)
    iterations = math.ceil(config.total_steps / env.num_envs)
    log_every = max(1, config.log.interval_steps // env.num_envs)
    progress = Progress(iterations * env.num_envs, f"{config.policy} policy on {config.env.task}")
    try:
        env.reset(seed=config.env.seed)
        start = time.monotonic()
        for it in range(1, iterations + 1):
            if config.policy == "random":
                action = torch.rand(env.num_envs, env.action_dim, generator=gen, device=env.device) * 2 - 1
            else:
                action = torch.zeros(env.num_envs, env.action_dim, device=env.device)
            episodes.update(env.step(action))
            shown = {}
            if it % log_every == 0 or it == iterations:
                steps = it * env.num_envs
                metrics = {"steps_per_second": steps / (time.monotonic() - start), **episodes.pop()}
                logger.log(steps, metrics)
                shown = {k: metrics[k] for k in ("episode_return",) if k in metrics}
            progress.update(env.num_envs, **shown)
    finally:
        progress.close()
        logger.close()
        env.close()
    return run.path
