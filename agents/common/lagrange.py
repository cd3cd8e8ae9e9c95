"""The Lagrange multiplier of a cost constraint E[episode cost] <= d, and the episode cost it is judged on.

lambda takes projected gradient-ascent steps on the dual, lambda <- clip(lambda + lr (J_c - d), 0, max):
the step is proportional to the violation, so lambda settles where the constraint is met. OmniSafe's
Adam on -lambda (J_c - d) normalizes the gradient away and steps by about +-lr on every update whatever
the violation, so lambda oscillates around its fixed point forever. Nothing divides by d: a limit of 0
(no cost allowed) only makes lambda rise to its maximum while any cost is paid.
"""

from __future__ import annotations

import torch
from torch import nn

from q2real.agents.common.normalizer import Gather, local
from q2real.sim.vec_env import StepResult


class EpisodeCost(nn.Module):
    """J_c: an exponential average of finished episodes' summed cost, kept on the device (no sync per
    step). Unset until the first episode ends; truncated episodes count as they were."""

    running: torch.Tensor
    average: torch.Tensor
    seen: torch.Tensor
    gather: Gather = staticmethod(local)

    def __init__(self, num_envs: int, rate: float = 0.05):
        super().__init__()
        self.rate = rate
        self.register_buffer("running", torch.zeros(num_envs))
        self.register_buffer("average", torch.zeros(()))
        self.register_buffer("seen", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def update(self, result: StepResult) -> None:
        self.running += result.cost
        done = result.done
        finished = self.gather(done).sum()
        mean = self.gather(self.running * done).sum() / finished.clamp(min=1)
        # k episodes ending together move the average as k single updates by their mean would.
        keep = torch.where(self.seen, (1 - self.rate) ** finished.float(), torch.zeros(()))
        self.average.copy_(torch.where(finished > 0, keep * self.average + (1 - keep) * mean, self.average))
        self.seen |= finished > 0
        self.running *= ~done


class Lagrange(nn.Module):
    value: torch.Tensor

    def __init__(self, limit: float, init: float, lr: float, max_value: float):
        super().__init__()
        self.limit, self.lr, self.max_value = limit, lr, max_value
        self.register_buffer("value", torch.tensor(float(init)))

    @torch.no_grad()
    def update(self, cost: torch.Tensor, known: torch.Tensor | bool = True) -> None:
        """One dual step against the cost estimate `cost` (a tensor, no sync); none while not `known`."""
        stepped = (self.value + self.lr * (cost - self.limit)).clamp(0.0, self.max_value)
        self.value.copy_(torch.where(torch.as_tensor(known), stepped, self.value))
