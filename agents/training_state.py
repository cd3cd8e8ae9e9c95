"""A training run as one checkpoint: what `Trainer` writes, and the checks before it reads one back.

Everything needed to continue bit-for-bit (networks, optimizers, normalizers, replay, sampler,
env state, counters and RNG states) as plain tensors and containers, with the resolved config, so a
resume can refuse a checkpoint of another algorithm, task, network or replay shape by name.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from q2real.agents.common.checkpoint import CheckpointError, check_shapes, load_checkpoint
from q2real.agents.learners import check_agent_checkpoint
from q2real.configs.loader import to_dict

if TYPE_CHECKING:
    from q2real.agents.train import Trainer

FORMAT = 1


def training_state(trainer: Trainer) -> dict[str, Any]:
    agent = trainer.agent
    keep = trainer.config.checkpoint_replay
    return {
        "format": FORMAT,
        "config": to_dict(trainer.config),
        "spaces": {"obs_dim": trainer.env.obs_dim, "action_dim": trainer.env.action_dim},
        "step": trainer.step,
        "world": trainer.ranks.world if trainer.ranks is not None else 1,
        "iteration": trainer.iteration,
        "updates": agent.updates,
        "update_credit": trainer.update_credit,
        "elapsed": trainer.logger.elapsed,
        "agent": agent.state_dict(),
        "agent_extra": agent.extra_state(),
        "optimizers": {name: opt.state_dict() for name, opt in agent.optimizers().items()},
        "replay": trainer.replay.state_dict() if keep else trainer.replay.empty_state(),
        "sampler": trainer.sampler.state_dict() if keep else {},
        "env": trainer.env.state_dict(),
        "obs": trainer.obs,
        "episodes": trainer.episodes.state_dict(),
        "chunks": trainer.chunks.queue.state_dict() if trainer.chunks is not None else {},
        "rng": {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all()},
    }


def restore(trainer: Trainer, path: Path, world: int = 1) -> float:
    """Load the checkpoint at `path` into `trainer` after checking it fits a job of `world` ranks;
    returns the run's elapsed seconds."""
    state = load_checkpoint(path, trainer.env.device)
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {state.get('format')!r}; this q2real reads format {FORMAT}")
    check_counters(path, state)
    state = upgrade(state)
    check_fits(trainer, path, state)
    written = int(state.get("world", 1))
    if written != world:
        how = (
            f"torchrun --nproc-per-node={written} (over all nodes)" if written > 1 else "one process, without torchrun"
        )
        raise CheckpointError(
            f"{path}: written by a run of {written} rank(s), resumed with {world}: each rank's replay and envs "
            f"are its own, so resume it with {how}"
        )
    agent = trainer.agent
    agent.load_state_dict(state["agent"])
    agent.load_extra_state(state["agent_extra"])
    for name, opt in agent.optimizers().items():
        opt.load_state_dict(state["optimizers"][name])
    agent.updates = int(state["updates"])
    trainer.replay.load_state_dict(state["replay"])
    trainer.sampler.load_state_dict(state.get("sampler", {}))
    if state["env"] is not None and trainer.env.state_dict() is not None:
        trainer.env.load_state_dict(state["env"])
        trainer.obs = state["obs"].to(trainer.env.device)
    trainer.episodes.load_state_dict(state["episodes"])
    if trainer.chunks is not None:
        trainer.chunks.queue.load_state_dict({k: v.to(trainer.env.device) for k, v in state["chunks"].items()})
    trainer.step, trainer.iteration = int(state["step"]), int(state["iteration"])
    if trainer.step > 0 and len(trainer.replay) == 0:  # written with checkpoint_replay=false
        per_iteration = trainer.envs_per_iteration
        refill = -(-trainer.config.agent.batch_size // per_iteration) * per_iteration
        trainer.learn_from = trainer.step + refill
        print(
            f"{path}: the checkpoint keeps no replay (checkpoint_replay=false): the policy refills it for "
            f"{refill} env steps before updates continue from step {trainer.learn_from}",
            flush=True,
        )
    trainer.update_credit = float(state["update_credit"])
    torch.set_rng_state(state["rng"]["torch"].cpu())
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["rng"]["cuda"]])
    return float(state["elapsed"])


def upgrade(state: dict[str, Any]) -> dict[str, Any]:
    """Fill in what checkpoints written before a field existed lack, as it would have been: replay kept
    no costs (the learners then never read them) and nobody summed the training cost."""
    replay = state["replay"]["data"]
    if "cost" not in replay:
        replay["cost"] = torch.zeros_like(replay["reward"])
    episodes = state["episodes"]
    if "training_cost" not in episodes:
        episodes["training_cost"] = torch.zeros_like(episodes["count"])
    return state


ENTRIES = (
    "config", "step", "iteration", "updates", "update_credit", "elapsed", "agent", "agent_extra",
    "optimizers", "replay", "env", "obs", "episodes", "rng",
)  # fmt: skip
"""What every checkpoint of this format holds (`sampler` and `chunks` may be empty)."""


def check_counters(path: Path, state: dict[str, Any]) -> None:
    """Refuse a checkpoint whose hash is valid but whose contents are not (an edit, a bug): a missing
    entry, or counters no run could have written."""
    missing = [key for key in ENTRIES if key not in state]
    if "rng" in state and "torch" not in state["rng"]:
        missing.append("rng.torch")
    if missing:
        raise CheckpointError(f"{path}: the checkpoint lacks {missing} (written by another program, or edited)")
    step, iteration = state["step"], state["iteration"]
    for key in ("step", "iteration", "updates"):
        if not isinstance(state[key], int) or state[key] < 0:
            raise CheckpointError(f"{path}: {key}: expected a whole number >= 0, got {state[key]!r}")
    try:  # the run that wrote it: its envs on every rank
        envs_per_iteration = int(state["config"]["env"]["num_envs"]) * int(state.get("world", 1))
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{path}: config: no env.num_envs a run could have written") from None
    if step != iteration * envs_per_iteration:
        raise CheckpointError(
            f"{path}: step {step} is not iteration {iteration} x {envs_per_iteration} env steps per iteration"
        )
    for key in ("update_credit", "elapsed"):
        value = state[key]
        if not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise CheckpointError(f"{path}: {key}: expected a finite number >= 0, got {value!r}")


def check_fits(trainer: Trainer, path: Path, state: dict[str, Any]) -> None:
    """Refuse a checkpoint this run cannot continue, naming the first setting or tensor that differs."""
    check_agent_checkpoint(path, state, trainer.config, trainer.agent, ("env.num_envs", "replay_capacity"))
    check_shapes(path, "agent_extra", state["agent_extra"], trainer.agent.extra_state())
    problem = trainer.replay.state_problem(state["replay"])
    if problem is not None:
        raise CheckpointError(f"{path}: {problem}")
    check_shapes(path, "episodes", state["episodes"], trainer.episodes.state_dict())
    sampler = trainer.sampler.state_dict()
    if state.get("sampler") and sampler:  # a prioritized sampler resuming a uniform run starts fresh
        check_shapes(path, "sampler", state["sampler"], sampler)
