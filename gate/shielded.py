"""Episodes of a policy bundle in a batch of simulated envs, each env behind the shield a robot would run."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from q2real.contracts.chunks import ChunkQueue
from q2real.contracts.schema import robot_from_metadata
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.hardware.action import action_from_command
from q2real.safety.compiled import Shield
from q2real.safety.flags import CLAMPS
from q2real.safety.shield import ShieldConfig
from q2real.sim.env import TaskEnv


@dataclass
class Episodes:
    returns: torch.Tensor
    """Of the first episode of every env."""
    costs: torch.Tensor
    """Safety cost of the same episodes (zeros for a task without one)."""
    interventions: float
    """Fraction of the episodes' ticks on which a shield clamp changed the policy's command."""
    change: float
    """Mean over the episodes' ticks of how far the clamps moved the command (mean over joints, in
    action units; `q2real.safety.shield.Counters.run_change`)."""
    rules: dict[str, float]
    """Fraction of the episodes' ticks on which each clamp rule acted (those that ever did)."""
    has_cost: bool = False
    """The task defines a safety cost (`costs` then means something)."""


def shielded_returns(
    bundle: PolicyBundle,
    env: TaskEnv,
    seed: int,
    shielded: bool = True,
    ended: Callable[[int], None] | None = None,
    from_default_pose: bool = False,
) -> Episodes:
    """The first episode of every env, acting with the bundle through one shield per env
    (`shielded=False`: the bundle's actions straight to the env, as trained without a shield);
    `ended(n)` hears of each step's newly ended episodes. `from_default_pose`: each episode starts with
    the robot at rest at its default pose, where the node's start ramp hands over on a robot.

    Each env gets the shield a robot would run (rebuilt from the bundle's metadata), started directly
    in RUN from the task's reset state; what reaches the simulator is the shield's command, mapped back
    to the env's [-1, 1] action. Position robots take the shield's targets at the spec gains (the rare
    gain reduction of its effort rule is not simulated). The shields tick in a Python loop over envs on
    purpose: they are the robot's own per-robot code, and the gate is an evaluation, not a training loop."""
    meta = bundle.info.metadata
    spec = robot_from_metadata(meta, str(bundle.path))
    # The bundle's action mapping, as on the robot (the node hands it to its shield the same way).
    config = ShieldConfig(
        ramp_time=0.0,
        ramp_max_distance=math.inf,
        action_scale=tuple(meta["action"]["scale"]),
        action_offset=tuple(meta["action"]["offset"]),
    )
    shields = [Shield(spec, config) for _ in range(env.num_envs)]
    chunk = bundle.info.chunk
    chunks = ChunkQueue(chunk, env.num_envs, env.action_dim, np) if chunk.size > 1 else None
    names, dt = spec.joint_names, spec.control_period
    task = env.task
    obs = env.reset(seed=seed)
    if from_default_pose:
        obs = env.rest_at_default_pose()
    physics = env.physics
    returns = torch.zeros(env.num_envs)
    costs = torch.zeros(env.num_envs)
    finished = torch.zeros(env.num_envs, dtype=torch.bool)
    flags = np.zeros(env.num_envs, dtype=np.int64)
    fired = {str(rule.name): 0 for rule in CLAMPS}
    ticks = interventions = 0
    change = 0.0
    scale, offset = shields[0].scale, shields[0].offset
    # `last_action` and `action_history` terms are the policy's own previous outputs on the robot (as the
    # node keeps them); the env saw the shield's.
    last, history = env.term_columns("last_action"), env.term_columns("action_history")
    outputs = np.zeros((env.num_envs, 0 if history is None else history.stop - history.start))
    previous = np.zeros((env.num_envs, env.action_dim))
    t = 0.0
    for shield, q, qd in zip(shields, *_joints(task, physics), strict=True):
        shield.tick(names, q, qd, t, t)
        shield.start()
        shield.run()
    while not bool(finished.all()):
        actions = bundle.normalized(bundle(obs[:, : env.policy_obs_dim].cpu().numpy()))
        if chunks is not None:  # each env's chunk executed as the node executes it, each tick shielded
            actions = chunks.act(actions)
        q, qd = _joints(task, physics)
        commanded = np.empty_like(actions)
        for i, shield in enumerate(shields):
            if not shielded:
                commanded[i] = actions[i]
                continue
            command = shield.tick(names, q[i], qd[i], t, t, actions[i], 0.0)
            value = command.effort if shield.torque else command.position
            commanded[i] = action_from_command(value, scale, offset)
            flags[i] = command.flags
        if shielded:
            running = ~finished.numpy()
            counted = flags[running]
            ticks += len(counted)
            clamped = (counted & int(CLAMPS)) != 0
            interventions += int(np.count_nonzero(clamped))
            change += float(np.abs(commanded - actions)[running][clamped].mean(-1).sum())
            for rule in CLAMPS:
                fired[str(rule.name)] += int(np.count_nonzero(counted & int(rule)))
        result = env.step(torch.from_numpy(commanded).float().to(env.device))
        physics = env.physics
        returns += torch.where(finished, 0.0, result.reward.cpu())
        costs += torch.where(finished, 0.0, result.cost.cpu())
        if ended is not None:
            ended(int((result.done.cpu() & ~finished).sum()))
        finished |= result.done.cpu()
        obs = result.obs
        # As the node does, an output that is not finite is not remembered (the shield held the target).
        finite = np.isfinite(actions).all(-1, keepdims=True)
        if history is not None:
            shifted = np.concatenate([previous, outputs], axis=1)[:, : outputs.shape[1]]
            outputs = np.where(finite, shifted, outputs)
            obs[:, history] = torch.from_numpy(outputs).to(obs)
        previous = np.where(finite, np.clip(actions, -1.0, 1.0), previous)
        if last is not None:
            obs[:, last] = torch.from_numpy(previous).to(obs)
        t += dt
    rules = {name: n / max(ticks, 1) for name, n in fired.items() if n}
    return Episodes(returns, costs, interventions / max(ticks, 1), change / max(ticks, 1), rules, env.has_cost)


def _joints(task, physics) -> tuple[np.ndarray, np.ndarray]:
    q = physics.qpos[:, task.qpos_index].double().cpu().numpy()
    qd = physics.qvel[:, task.qvel_index].double().cpu().numpy()
    return q, qd
