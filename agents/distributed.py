"""Data-parallel training on torch.distributed: one rank per device (or CPU process), launched by torchrun.

Each rank owns its envs (seeded apart) and its replay; extra ranks are extra environments. What keeps
the ranks one learner:
- gradients are averaged in one flat all-reduce per optimizer step, together with any BatchNorm
  running statistics. DDP would need every forward through its wrapper, but the critic runs in the
  actor's loss and the target step too; one flat message over the networks' weights works with every
  loss as it is, and was faster here (bench/grad_sync.py, 2 gloo ranks: a 256x256 SAC critic update
  12.6 ms against DDP's 15.5, 8.1 unsynchronized; 1024x1024 99.5 against 101.7);
- running statistics (observation normalizer, return scale, episode cost) are updated from every
  rank's rows, gathered in rank order, so each rank computes what one process over all envs would;
- rank 0's initial weights are broadcast, so the temperature, the targets and every optimizer state
  start and stay identical;
- whether to stop is agreed every iteration on a CPU (gloo) group, so an early stop on rank 0 ends
  every rank at the same iteration without a device sync.
A rank that raises or dies ends the job: torchrun's elastic agent stops the others and reports the
failing rank's error (recorded by `record` on the entry point); a collective left waiting on a dead
peer fails after `timeout` rather than hanging.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed import ProcessGroup

from q2real.sim.config import resolve_device

SEED_STRIDE = 1_000_003
"""Rank r's envs are seeded `seed + r * SEED_STRIDE`: apart from each other and from the evaluation seeds."""

PREVIOUS_CHECKPOINT = "checkpoint.previous.pt"
"""A rank's checkpoint before its latest, kept until rank 0 has written the same step."""


def rank_dir(rank: int) -> str:
    """Where rank r > 0 keeps its checkpoint inside rank 0's run directory."""
    return f"rank{rank}"


TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("Q2REAL_DIST_TIMEOUT", "120")))
"""How long a collective waits for a peer before failing (torch's default is 30 minutes)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in a torchrun job."""

    rank: int
    world: int
    local_rank: int
    local_world: int

    @classmethod
    def launched(cls) -> Ranks | None:
        """The job torchrun (or any launcher setting its variables) started this process in, or None
        when it runs alone (a one-process job is a plain run)."""
        env = os.environ
        if int(env.get("WORLD_SIZE", "1")) <= 1:
            return None
        try:
            return cls(
                int(env["RANK"]),
                int(env["WORLD_SIZE"]),
                int(env.get("LOCAL_RANK", env["RANK"])),
                int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            )
        except (KeyError, ValueError) as err:
            raise RuntimeError(
                f"WORLD_SIZE={env['WORLD_SIZE']} but RANK/LOCAL_RANK are missing or not integers ({err}): "
                "launch data-parallel training with torchrun"
            ) from None

    @property
    def leader(self) -> bool:
        """Rank 0: it logs, evaluates and writes the run directory."""
        return self.rank == 0

    def device(self, device: str) -> str:
        """One GPU per rank on a node (`auto` resolved first); CPU ranks share the host."""
        resolved = resolve_device(device)
        return f"cuda:{self.local_rank}" if resolved.type == "cuda" else str(resolved)


class DataParallel:
    """The collectives of one data-parallel learner; built after `torch.distributed` is initialized."""

    def __init__(self, ranks: Ranks, device: torch.device):
        self.ranks, self.device = ranks, device
        if not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=TIMEOUT)
        if dist.get_world_size() != ranks.world or dist.get_rank() != ranks.rank:
            raise RuntimeError(
                f"the process group is rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"the environment says {ranks.rank} of {ranks.world}"
            )
        # Control decisions (stop, checkpoint steps) go over CPU, never through the training device.
        self.control: ProcessGroup | None = None
        if device.type == "cuda":
            self.control = cast(ProcessGroup, dist.new_group(backend="gloo", timeout=TIMEOUT))
        self._running: list[torch.Tensor] = []
        """BatchNorm running statistics, averaged with the gradients (each rank normalizes its own batch)."""

    # --- the learner's state -----------------------------------------------------------------------
    def attach(self, agent: nn.Module) -> None:
        """Make `agent` one learner across the ranks: rank 0's weights and statistics everywhere, its
        running statistics fed with every rank's rows, its gradients averaged at every step."""
        config = getattr(agent, "config", None)
        if getattr(config, "compile", False):
            raise ValueError("compile: a compiled step does not average gradients over the ranks; use false")
        self.broadcast(agent)
        for module in agent.modules():
            if hasattr(module, "gather"):
                object.__setattr__(module, "gather", self.gather)  # a plain attribute, not state
        object.__setattr__(agent, "average_gradients", self.average_gradients)
        self._running = [
            buffer
            for module in agent.modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm)
            for buffer in (module.running_mean, module.running_var)
            if buffer is not None
        ]

    def broadcast(self, module: nn.Module) -> None:
        """Rank 0's parameters and buffers to every rank."""
        for tensor in module.state_dict().values():
            if isinstance(tensor, torch.Tensor) and tensor.numel():
                dist.broadcast(tensor, 0)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` concatenated along the first dimension, in rank order."""
        out = torch.empty((self.ranks.world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_single(out, x.contiguous())
        return out

    def average_gradients(self, parameters: Iterable[nn.Parameter]) -> None:
        """Replace each gradient by its mean over the ranks, in one message (with the BatchNorm running
        statistics, averaged alike). A parameter without a gradient contributes zeros, so every rank
        sends the same layout."""
        parameters = [p for p in parameters if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = _flatten_dense_tensors(grads + self._running)
        dist.all_reduce(flat)
        flat /= self.ranks.world
        means = _unflatten_dense_tensors(flat, grads + self._running)
        for p, mean in zip(parameters, means[: len(parameters)], strict=True):
            if p.grad is None:
                p.grad = mean
            else:
                p.grad.copy_(mean)
        for buffer, mean in zip(self._running, means[len(parameters) :], strict=True):
            buffer.copy_(mean)

    # --- the loop's decisions ----------------------------------------------------------------------
    def any(self, flag: bool) -> bool:
        """Whether any rank's `flag` is set (a CPU all-reduce; every rank must call it)."""
        value = torch.tensor([int(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.control)
        return bool(value[0])

    def from_leader(self, value: object) -> object:
        """Rank 0's `value` on every rank (a run directory, a checkpoint's step)."""
        box = [value]
        dist.broadcast_object_list(box, 0, group=self.control)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
