"""Export a training run's deterministic policy as a policy bundle (ONNX + metadata).

The observation normalizer and the action-to-command scaling are baked into the graph, as rsl_rl
does, so the robot side feeds raw observations and gets joint commands; the metadata is written
into the ONNX file and to an identical JSON sidecar. The document's schema and its validation live in
`q2real.contracts.schema`, which the robot side reads too; neither needs the other's runtime.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from q2real.agents.algos.sac_lag import SACLag
from q2real.agents.common.actor_critic import ActorCritic
from q2real.agents.common.checkpoint import CHECKPOINT
from q2real.agents.common.networks import float32_matmuls
from q2real.agents.common.run_dir import git_state
from q2real.agents.config import TrainConfig, load_run_config
from q2real.agents.learners import restore_agent
from q2real.configs.loader import to_dict
from q2real.contracts.chunks import ChunkSpec
from q2real.contracts.schema import (
    METADATA_KEY,
    SCHEMA_VERSION,
    BundleError,
    read_metadata,
    robot_metadata,
    seal,
)
from q2real.hardware.action import command_from_action
from q2real.sim import VecEnv, make
from q2real.sim.action_steps import KEY as STEPS_KEY
from q2real.sim.action_steps import ActionSteps

# Opset 17 runs on every onnxruntime from 1.14 on, including the ARM builds robot computers ship.
OPSET = 17


class CommandGraph(nn.Module):
    """raw obs -> `policy` (actions in [-1, 1], a chunk's flattened) -> clip -> joint commands,
    (batch, action_dim), or (batch, chunk, action_dim) for a chunk policy, one row per tick.

    With `steps` (a task's `action_rate`) the policy's action is a step: the graph moves the previous
    action, read from the observation's `last_action` columns, by it, as the env did in training; the
    node and shield then receive targets as from any other bundle."""

    scale: torch.Tensor

    def __init__(
        self,
        policy: nn.Module,
        chunk: int,
        scale: torch.Tensor,
        offset: torch.Tensor,
        steps: tuple[ActionSteps, slice] | None = None,
    ):
        super().__init__()
        self.policy = copy.deepcopy(policy).cpu()
        self.register_buffer("scale", scale.detach().cpu().float())
        self.register_buffer("offset", offset.detach().cpu().float())
        self.steps = None if steps is None else steps[0].to("cpu")
        self.last = None if steps is None else steps[1]
        self.chunk = chunk
        if steps is not None and chunk > 1:
            raise BundleError(f"{STEPS_KEY}: steps are taken one per tick, not in chunks")
        self.eval()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.command(obs, self.policy(obs).clamp(-1.0, 1.0))

    def command(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Joint commands for the policy's clipped `action` (a step from the previous action, where the
        graph takes steps)."""
        if self.steps is not None:
            action = self.steps.target(obs[:, self.last], action)
        if self.chunk > 1:
            action = action.reshape(-1, self.chunk, self.scale.numel())
        return command_from_action(action, self.scale, self.offset)


def action_steps(env: VecEnv) -> tuple[ActionSteps, slice] | None:
    """The env's action steps and where its observation holds the previous action, for `CommandGraph`."""
    if env.action_steps is None:
        return None
    last = env.term_columns("last_action")
    if last is None:
        raise BundleError(f"{STEPS_KEY}: the observation has no last_action term to step from")
    return env.action_steps, last


class DeployPolicy(CommandGraph):
    """An actor-critic's deterministic policy for `env`: its observation normalizer, then its policy network
    (the averaged actor where the learner keeps one, else the actor)."""

    def __init__(self, agent: ActorCritic, env: VecEnv):
        policy = nn.Sequential(agent.obs_norm.leading(agent.policy_obs_dim), agent.policy)
        chunk = agent.config.chunk.policy_length
        super().__init__(policy, chunk, env.action_scale, env.action_offset, action_steps(env))


class CostGraph(CommandGraph):
    """An actor-critic's deterministic policy with a second output, `cost_q` (batch,): the cost critic's
    Q_c(s, pi(s)) of the action the policy just chose (a step, where the policy takes steps), in the
    learner's own units (the discounted cost to come), for the node's veto. The actor runs once for both
    outputs."""

    def __init__(self, agent: SACLag, env: VecEnv):
        super().__init__(agent.policy, 1, env.action_scale, env.action_offset, action_steps(env))
        self.norm = copy.deepcopy(agent.obs_norm).cpu()
        self.cost = copy.deepcopy(agent.cost_critic).cpu()
        self.eval()

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # pyright: ignore[reportIncompatibleMethodOverride]
        normalized = self.norm(obs)
        action = self.policy(normalized).clamp(-1.0, 1.0)
        return self.command(obs, action), self.cost.value(normalized, action)


def cost_metadata(agent: SACLag) -> dict[str, Any]:
    cfg = agent.config
    return {
        "output": "cost_q",
        "meaning": "discounted safety cost to come of the policy's action, Q_c(obs, policy(obs))",
        "cost_limit": cfg.cost_limit,
        "value_limit": agent.value_limit,
        "gamma": cfg.gamma,
        "limit_horizon": cfg.limit_horizon,
        "estimate": agent.cost_estimate,
    }


def bundle_metadata(
    env: VecEnv, task: str, normalization: dict, chunk: ChunkSpec, training: dict[str, Any]
) -> dict[str, Any]:
    """The metadata document of a policy for `env`; every number at full precision (JSON floats are
    float64). `training` says where the policy came from (algo, config, and what else its maker records)."""
    spec = getattr(env, "spec", None)
    if env.control_period is None:
        raise BundleError(f"{task}: the env does not say its control period; a bundle needs one")
    actions_shape = ["batch", *([chunk.size] if chunk.size > 1 else []), env.action_dim]
    return {
        "schema_version": SCHEMA_VERSION,
        "task": task,
        "robot": robot_metadata(spec) if spec is not None else None,
        "control_period": env.control_period,
        "observation": {
            "dim": env.policy_obs_dim,
            "terms": [
                {"name": n, "dim": d} | ({"source": env.obs_sources[i]} if env.obs_sources else {})
                for i, (n, d) in enumerate(zip(env.obs_names, env.obs_dims, strict=True))
            ],
            "normalization": normalization,
        },
        "action": {
            "dim": env.action_dim,
            "clip": [-1.0, 1.0],
            "scale": env.action_scale.double().tolist(),
            "offset": env.action_offset.double().tolist(),
            "output": "offset + scale * clip(policy(obs), -1, 1), in the robot's units"
            if env.action_steps is None
            else "offset + scale * clip(last_action + step * clip(policy(obs), -1, 1), step_range), in the "
            "robot's units (the policy steps from its previous action, the observation's last_action term)",
            **(env.action_steps.metadata() if env.action_steps is not None else {}),
        },
        "io": {
            "input": {"name": "obs", "shape": ["batch", env.policy_obs_dim]},
            "output": {"name": "actions", "shape": actions_shape},
        },
        **({"chunk": chunk.metadata(env.control_period)} if chunk.size > 1 else {}),
        **({"figures": env.figures} if getattr(env, "figures", None) else {}),
        "training": training,
        "git_sha": git_state(Path(__file__).resolve().parent)["git_sha"],
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "opset": OPSET,
    }


def agent_metadata(config: TrainConfig, env: VecEnv, agent: ActorCritic, step: int) -> dict[str, Any]:
    normalization = {"baked_in": agent.obs_norm.enabled, "clip": agent.obs_norm.clip}
    training = {"algo": config.algo, "env_steps": step, "config": to_dict(config)}
    meta = bundle_metadata(env, config.env.task, normalization, agent.config.chunk.spec(), training)
    if isinstance(agent, SACLag):
        meta["cost_critic"] = cost_metadata(agent)
        meta["io"]["cost_output"] = {"name": "cost_q", "shape": ["batch"]}
    return meta


def load_run_policy(run_dir: Path) -> tuple[TrainConfig, VecEnv, ActorCritic, int]:
    """Config, a one-env CPU instance of the task, and the agent restored from the run's checkpoint."""
    config = load_run_config(run_dir, CHECKPOINT)
    # Only the task's shapes and scales are needed: a q2real task builds them on native MuJoCo, with no
    # GPU and no XLA compile, whichever backend trained it (an adapter task keeps its own simulator).
    native = {} if ":" in config.env.task else {"backend": "mujoco"}
    env = make(dataclasses.replace(config.env, num_envs=1, device="cpu", **native))
    try:
        agent, step = restore_agent(run_dir, config, env)
    except BaseException:
        env.close()
        raise
    return config, env, agent, step


def export_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write `<run_dir>/policy.onnx` (or `output`) and its `.json` sidecar; returns the ONNX path."""
    run_dir = Path(run_dir)
    config, env, agent, step = load_run_policy(run_dir)
    try:
        return write_bundle(config, env, agent, step, Path(output) if output else run_dir / "policy.onnx")
    finally:
        env.close()


def write_bundle(config: TrainConfig, env: VecEnv, agent: ActorCritic, step: int, output: Path) -> Path:
    """Export `agent`'s deterministic policy for `env` to `output` (atomically) plus the JSON sidecar; a
    constrained learner's cost critic goes along as the graph's second output."""
    policy: nn.Module = CostGraph(agent, env) if isinstance(agent, SACLag) else DeployPolicy(agent, env)
    return write_graph(policy, agent_metadata(config, env, agent, step), output)


def write_graph(policy: nn.Module, meta: dict[str, Any], output: Path) -> Path:
    """Trace `policy` (raw obs -> joint commands) to ONNX at `output` with `meta` embedded, atomically,
    and write the JSON sidecar; our own loader must accept the result."""
    tmp = output.with_name(f".{output.name}.tmp")
    outputs = ["actions", *(["cost_q"] if "cost_critic" in meta else [])]
    with float32_matmuls(policy):  # a policy trained with bfloat16 products deploys as float32
        torch.onnx.export(
            policy,
            (torch.zeros(1, meta["observation"]["dim"]),),
            str(tmp),
            input_names=["obs"],
            output_names=outputs,
            dynamic_axes={"obs": {0: "batch"}, **{name: {0: "batch"} for name in outputs}},
            opset_version=OPSET,
            dynamo=False,
        )
    model = onnx.load(str(tmp))
    text = json.dumps(meta, indent=2, allow_nan=False)
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, text
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(tmp))
    seal(tmp)
    os.replace(tmp, output)
    output.with_suffix(output.suffix + ".json").write_text(text)
    read_metadata(output)  # refuse to hand out a bundle our own loader would refuse
    return output
