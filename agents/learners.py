"""Building the learner `algo` names (`LEARNERS`) for an env, and whether a checkpoint fits it."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import torch

from q2real.agents.algos.sac_lag import SACLag
from q2real.agents.common.actor_critic import ActorCritic, ActorCriticConfig, Sizes
from q2real.agents.common.checkpoint import CHECKPOINT, check_config, check_shapes, load_checkpoint
from q2real.agents.config import TrainConfig
from q2real.agents.registry import LEARNERS
from q2real.configs.loader import to_dict
from q2real.sim import VecEnv

C = TypeVar("C", bound=ActorCriticConfig)

# Agent settings that decide which tensors a learner holds and their shapes; a checkpoint only fits a
# run that agrees on them (keys a section lacks, such as SAC's target_actor, are skipped).
AGENT_SHAPE_KEYS = (
    "network",
    "critic_network",
    "actor_hidden",
    "critic_hidden",
    "num_critics",
    "critic_head",
    "num_atoms",
    "num_quantiles",
    "num_cost_critics",
    "noise_repeat",
    "target_actor",
    "target_network",
    "chunk",
)


def build_agent(config: TrainConfig, env: VecEnv) -> ActorCritic:
    """The configured learner for `env`'s spaces, sized for the training env count (`config.env.num_envs`),
    since per-env exploration and return-scale state are part of its checkpoint."""
    agent_config = config.agent
    if config.sampler.kind == "dspear" and config.sampler.critic_stream:
        agent_config = dataclasses.replace(agent_config, huber=True)  # D-SPEAR's critic stream: Huber TD loss
    if issubclass(LEARNERS[config.algo].learner, SACLag):
        env.require_policy_obs(f"{config.algo}'s cost critic, which the deploy node queries,")
    return LEARNERS[config.algo].learner(agent_config, Sizes.of(env, config.env.num_envs))


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


PER_ENV_STATE = ("return_scale.ret", "episode_cost.running")
"""Learner state kept per training env (reward scaling's running return, SAC-Lag's running episode
cost): about episodes under way in the run that wrote it, so another run starts it at zero."""


Insertions = Sequence[tuple[int, int]]
"""(column, count) pairs in the stored observation's columns, in order: `count` new columns go in at
`column` (policy terms appended at the end of the policy's columns, critic-only terms at the end of the
critic's, before the action where a network takes one)."""


def load_learner(agent: ActorCritic, run_dir: Path, config: TrainConfig, grown: Insertions = ()) -> dict:
    """Load the learner state of the run at `run_dir` into `agent` (networks, normalizer and batch-norm
    statistics, SAC's temperature, a Lagrange multiplier; per-env state starts at zero, so the run may
    train another env count) and return its checkpoint. `grown`: the observation columns the run lacked,
    terms appended since (`widened`)."""
    path = run_dir / CHECKPOINT
    state = load_checkpoint(path, agent.device)
    weights = dict(state["agent"])
    mine = agent.state_dict()
    if grown:
        weights = widened(weights, mine, grown)
        state = state | {"spaces": state.get("spaces", {}) | {"obs_dim": agent.obs_dim}}
    for key in PER_ENV_STATE:
        if key in weights:
            weights[key] = torch.zeros_like(mine[key])
    check_agent_checkpoint(path, state | {"agent": weights}, config, agent)
    agent.load_state_dict(weights)
    return state


def widened(weights: dict, mine: dict, insertions: Insertions) -> dict:
    """A learner's `weights` for an observation with the columns of `insertions` added. A tensor longer
    than stored along one axis takes the leading insertions whose counts add up to the difference (the
    actor's input grows by the policy's terms, the critics' and the normalizer's by the critic-only terms
    too); the new entries take `mine`'s (this learner's initial normalizer and batch-norm statistics, and
    zero for a layer's input weights, so the networks compute what they did until training moves them).
    The normalizer's new columns start at mean 0 and variance 1 and move at the old sample count's pace:
    right for terms already in [-1, 1], as earlier actions are."""
    out = dict(weights)
    for key, stored in weights.items():
        target = mine.get(key)
        if key in PER_ENV_STATE or not isinstance(stored, torch.Tensor) or target is None:
            continue
        if stored.shape == target.shape or stored.dim() != target.dim():
            continue
        axes = [a for a, (s, t) in enumerate(zip(stored.shape, target.shape, strict=True)) if s != t]
        counts = list(itertools.accumulate(count for _, count in insertions))
        if len(axes) != 1 or (grow := target.shape[axes[0]] - stored.shape[axes[0]]) not in counts:
            continue  # left for check_shapes to name
        axis, used = axes[0], insertions[: counts.index(grow) + 1]
        fresh = torch.zeros_like(target) if key.endswith("weight") else target.clone()
        pieces, start, added = [], 0, 0
        for column, count in used:
            pieces += [stored.narrow(axis, start, column - start), fresh.narrow(axis, column + added, count)]
            start, added = column, added + count
        out[key] = torch.cat([*pieces, stored.narrow(axis, start, stored.shape[axis] - start)], dim=axis)
    return out


def acting(config: C) -> C:
    """A learner's settings for an agent that only acts (evaluation, the gate, export): without compiled
    steps, which only updates run and which need a C++ compiler."""
    return dataclasses.replace(config, compile=False)


def restore_agent(run_dir: Path, config: TrainConfig, env: VecEnv) -> tuple[ActorCritic, int]:
    """The run's agent for `env` from its checkpoint, in eval mode, and the env step it was saved at."""
    path = run_dir / CHECKPOINT
    agent = build_agent(dataclasses.replace(config, agent=acting(config.agent)), env)
    state = load_checkpoint(path, env.device)
    check_agent_checkpoint(path, state, config, agent)
    agent.load_state_dict(state["agent"])
    agent.eval()
    return agent, int(state["step"])
