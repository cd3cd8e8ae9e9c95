"""Run by torchrun (2 ranks): the all-reduced gradient of TD3 (deterministic targets) on each rank's own
batch against one process's gradient on the two batches concatenated; prints the largest difference."""

from __future__ import annotations

import copy
import json
import sys

import torch
import torch.distributed as dist
from conftest import make_batch  # beside this script, which torchrun runs from its own folder
from test_updates import ACT, BATCH, OBS

from q2real.agents.algos.td3 import TD3, TD3Config
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.replay import Batch
from q2real.agents.distributed import DataParallel, Ranks


def main() -> None:
    ranks = Ranks.launched()
    assert ranks is not None, "run under torchrun with 2 ranks"
    torch.manual_seed(0)
    agent = TD3(TD3Config(target_noise=0.0, policy_delay=1), Sizes(OBS, ACT, 1, torch.device("cpu")))
    single = copy.deepcopy(agent)
    DataParallel(ranks, torch.device("cpu")).attach(agent)
    mine = make_batch(BATCH, OBS, ACT, ranks.rank, cost_rate=0.3)
    first, second = (make_batch(BATCH, OBS, ACT, seed, cost_rate=0.3) for seed in (0, 1))
    fields = ("obs", "action", "reward", "next_obs", "discount", "row", "env", "cost")
    both = Batch(**{name: torch.cat([getattr(first, name), getattr(second, name)]) for name in fields})
    worst = 0.0
    for learner, data in ((agent, mine), (single, both)):
        learner.critic_update(data)
        learner.actor_update(data.obs)
    for (name, p), q in zip(agent.named_parameters(), single.parameters(), strict=True):
        worst = max(worst, float((p - q).detach().abs().max()))
        assert p.grad is None or q.grad is not None, name
        if p.grad is not None and q.grad is not None:
            worst = max(worst, float((p.grad - q.grad).abs().max()))
    if ranks.leader:
        print(json.dumps({"grad_exactness_max_abs_diff": worst}))
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
