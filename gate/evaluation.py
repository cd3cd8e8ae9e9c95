"""Evaluate a training run from its directory alone, with its torch checkpoint or an exported bundle."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from q2real.agents.callbacks import ChunkExecutor, deterministic_policy, evaluate
from q2real.agents.common.checkpoint import CHECKPOINT
from q2real.agents.config import load_run_config
from q2real.agents.learners import restore_agent
from q2real.configs.loader import ConfigError
from q2real.sim import make


def evaluate_run(
    run_dir: str | Path, episodes: int = 20, seed: int = 12345, bundle: str | Path | None = None
) -> torch.Tensor:
    """Returns of `episodes` deterministic episodes (one per env). With `bundle`, the exported ONNX policy
    acts (through onnxruntime) instead of the torch checkpoint, on the very same seeded episodes."""
    run_dir = Path(run_dir)
    if episodes < 1:
        raise ConfigError(f"--episodes: expected >= 1, got {episodes}")
    config = load_run_config(run_dir, *(() if bundle is not None else (CHECKPOINT,)))
    env = make(dataclasses.replace(config.env, num_envs=episodes, seed=seed))
    try:
        if bundle is not None:
            from q2real.deploy_ros.bundle import PolicyBundle

            runner = PolicyBundle(bundle)

            def predict(obs: torch.Tensor) -> torch.Tensor:
                commands = runner(obs.cpu().numpy())
                return torch.from_numpy(runner.normalized(commands)).to(env.device)

            chunk = runner.info.chunk
            policy = ChunkExecutor(predict, chunk, env) if chunk.size > 1 else predict
        else:
            agent, _ = restore_agent(run_dir, config, env)
            policy = deterministic_policy(agent, env)
        return evaluate(policy, env, seed).cpu()
    finally:
        env.close()
