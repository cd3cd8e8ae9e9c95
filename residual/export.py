"""A residual run as one policy bundle: base and residual in a single ONNX graph.

raw obs -> base (its own normalizer baked in) -> [obs, a_base] -> the residual agent's normalizer ->
clip(a_base + scale * tanh(mu)) -> joint commands. The deploy node runs it as any other bundle; the
metadata's `training.residual` records the bound, the base's run directory, its dataset and a hash
of its checkpoint, so a bundle always says which clone it corrects.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import torch
from torch import nn

from q2real.agents.algos.sac import SACConfig
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.checkpoint import CHECKPOINT, load_checkpoint
from q2real.agents.export import CommandGraph, agent_metadata, write_graph
from q2real.agents.learners import acting, check_agent_checkpoint
from q2real.configs.loader import load, to_dict
from q2real.residual.base_env import BaseActionEnv
from q2real.residual.bc import BCPolicy, load_bc
from q2real.residual.learner import ResidualSAC
from q2real.residual.train import ResidualTrainConfig
from q2real.sim import VecEnv, make


class ResidualGraph(nn.Module):
    def __init__(self, base: BCPolicy, agent: ResidualSAC):
        super().__init__()
        self.base, self.obs_norm, self.actor = base, agent.obs_norm, agent.policy

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        extended = torch.cat([obs, self.base(obs).clamp(-1.0, 1.0)], dim=-1)
        return self.actor(self.obs_norm(extended))


def load_residual_run(run_dir: Path) -> tuple[ResidualTrainConfig, VecEnv, ResidualSAC, int, BCPolicy | None]:
    """Config, a one-env CPU instance of the task, the agent from the checkpoint, its step and the base."""
    config = load(ResidualTrainConfig, str(run_dir / "config.yaml"))
    base = load_bc(config.residual.base)[1] if config.residual.base else None
    base_dim = base.action_dim * base.chunk if base is not None else 0
    raw = make(dataclasses.replace(config.env, num_envs=1, device="cpu"))
    env: VecEnv = BaseActionEnv(raw, base, base_dim) if base is not None else raw
    try:
        assert isinstance(config.agent, SACConfig)
        agent = ResidualSAC(acting(config.agent), Sizes.of(env, config.env.num_envs), config.residual, base_dim)
        path = run_dir / CHECKPOINT
        state = load_checkpoint(path, "cpu")
        check_agent_checkpoint(path, state, config, agent)
        agent.load_state_dict(state["agent"])
        agent.eval()
    except BaseException:
        env.close()
        raise
    return config, env, agent, int(state["step"]), base


def export_residual(run_dir: str | Path, output: str | Path | None = None) -> Path:
    run_dir = Path(run_dir)
    config, env, agent, step, base = load_residual_run(run_dir)
    try:
        raw = env.env if isinstance(env, BaseActionEnv) else env
        if base is None:
            policy: nn.Module = nn.Sequential(agent.obs_norm, agent.policy)
        else:
            policy = ResidualGraph(base, agent)
        graph = CommandGraph(policy, agent.config.chunk.policy_length, raw.action_scale, raw.action_offset)
        meta = agent_metadata(config, raw, agent, step)
        meta["training"]["algo"] = "residual" if base is not None else "rlpd"
        meta["training"]["residual"] = {
            "scale": config.residual.scale if base is not None else None,
            "base": base_provenance(config.residual.base) if base is not None else None,
            "demos": config.residual.demos or None,
        }
        return write_graph(graph, meta, Path(output) if output else run_dir / "policy.onnx")
    finally:
        env.close()


def base_provenance(base_dir: str) -> dict:
    path = Path(base_dir)
    base_config, _, state = load_bc(path)
    return {
        "run_dir": str(path.resolve()),
        "algo": "bc",
        "checkpoint_sha256": hashlib.sha256((path / CHECKPOINT).read_bytes()).hexdigest(),
        "dataset": base_config.dataset,
        "episodes": state["episodes"],
        "chunk": base_config.chunk,
        "config": to_dict(base_config),
    }
