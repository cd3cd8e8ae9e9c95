"""What a training job will allocate, checked against the memory of its device before anything is
allocated: a replay capacity, batch size or network width too large for the machine is refused by
name, instead of reaching torch's allocator ("can't allocate 120 TB") minutes into the run."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from q2real.agents.common.actor_critic import ActorCriticConfig
from q2real.configs.loader import ConfigError

FLOAT = 4
ADAM = 4
"""Copies of every parameter a step keeps: the weights, their gradients and Adam's two moments."""


def _mlp(inputs: int, hidden: tuple[int, ...], outputs: int) -> int:
    widths = (inputs, *hidden, outputs)
    return sum((a + 1) * b for a, b in zip(widths, widths[1:], strict=False))


def estimate(
    algo: str, agent: ActorCriticConfig, replay_capacity: int, obs_dim: int, action_dim: int
) -> dict[str, int]:
    """Bytes each setting costs, named by the key that sets it (an estimate: a lower bound)."""
    chunk = max(1, agent.chunk.size)
    actor = _mlp(obs_dim, agent.actor_hidden, 2 * action_dim * chunk)
    heads = {"categorical": agent.num_atoms, "quantile": agent.num_quantiles}.get(agent.critic_head, 1)
    critic = _mlp(obs_dim + action_dim * chunk, agent.critic_hidden, heads) * agent.num_critics
    networks = FLOAT * (ADAM * (actor + critic) + critic)  # the critics' targets too
    # Activations kept for the backward pass of one batch: every layer of the actor and each critic.
    widths = sum(agent.actor_hidden) + agent.num_critics * sum(agent.critic_hidden)
    batch = FLOAT * 3 * agent.batch_size * (widths + 2 * (obs_dim + action_dim * chunk))
    row = FLOAT * (2 * obs_dim + action_dim + 2) + 2  # obs, next_obs, action, reward, cost, two flags
    return {
        "replay_capacity": replay_capacity * row,
        f"{algo}.actor_hidden/critic_hidden": networks,
        f"{algo}.batch_size": batch,
    }


def available(device: torch.device) -> int:
    """Bytes free on `device`: the GPU's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_fits(
    algo: str, agent: ActorCriticConfig, replay_capacity: int, obs_dim: int, action_dim: int, device: torch.device
) -> None:
    """Refuse a job whose replay, networks and batch together need more than the device has free,
    naming the setting that costs the most."""
    costs = estimate(algo, agent, replay_capacity, obs_dim, action_dim)
    free = available(device)
    if sum(costs.values()) > free:
        key = max(costs, key=costs.__getitem__)
        raise ConfigError(
            f"{key}: this job needs about {sum(costs.values()) / 2**30:.3g} GiB of {device.type} memory "
            f"({key} alone {costs[key] / 2**30:.3g} GiB), more than the {free / 2**30:.3g} GiB free; lower it"
        )
