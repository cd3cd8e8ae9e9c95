"""Run by torchrun (bench/distributed.py): one SAC critic update (two Q networks, batch 256, Adam) per
rank, its gradients averaged three ways: not at all (the compute floor), q2real's one flat all-reduce
(`DataParallel.average_gradients`), and torch's DistributedDataParallel (bucketed all-reduces that
overlap the backward pass). Prints milliseconds per update for each, on rank 0, as one JSON line.

Results: docs/results/speed.md
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from q2real.agents.distributed import DataParallel, Ranks

OBS, ACT, BATCH = 17, 6, 256
"""HalfCheetah's sizes; the network, not the input, is what the all-reduce carries."""
WARMUP, UPDATES = 20, 200


class Critics(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()

        def q() -> nn.Sequential:
            return nn.Sequential(
                nn.Linear(OBS + ACT, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
            )

        self.q1, self.q2 = q(), q()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q1(x), self.q2(x)


def time_updates(model: nn.Module, forward: nn.Module, sync) -> float:
    """Milliseconds per update over UPDATES, after WARMUP."""
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    x, y = torch.randn(BATCH, OBS + ACT), torch.randn(BATCH, 1)
    for i in range(WARMUP + UPDATES):
        if i == WARMUP:
            dist.barrier()
            start = time.perf_counter()
        q1, q2 = forward(x)
        loss = (q1 - y).square().mean() + (q2 - y).square().mean()
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        sync(model.parameters())
        optimizer.step()
    return (time.perf_counter() - start) / UPDATES * 1000  # pyright: ignore[reportPossiblyUnbound]


def main() -> None:
    ranks = Ranks.launched()
    assert ranks is not None, "run under torchrun"
    torch.set_num_threads(1)
    parallel = DataParallel(ranks, torch.device("cpu"))
    result = {}
    for hidden in (256, 1024):
        torch.manual_seed(0)
        plain, flat, wrapped = Critics(hidden), Critics(hidden), Critics(hidden)
        ddp = DistributedDataParallel(wrapped)
        result[f"hidden_{hidden}"] = {
            "no_sync_ms": time_updates(plain, plain, lambda _: None),
            "flat_all_reduce_ms": time_updates(flat, flat, parallel.average_gradients),
            "ddp_ms": time_updates(wrapped, ddp, lambda _: None),
            "parameters": sum(p.numel() for p in plain.parameters()),
        }
    if ranks.leader:
        print(json.dumps(result))
    parallel.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
