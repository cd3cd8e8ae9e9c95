"""A frozen policy the actor is kept near: the trust region of fine-tuning on a robot.

An actor fine-tuned on a robot learns from transitions its last good version collected (with the
node's noise, and in trials its own). Where its critic has seen no data the critic's errors are what
the actor climbs, so a fine-tuned actor left free drifts to actions the robot never tried and that
score badly there. The anchor is the last good version with its own observation statistics: the actor
loss pays `weight` times the squared distance between the actor's deterministic action and the
anchor's, per observation (summed over action dimensions), which keeps each candidate inside the
region the robot's data cover (TD3+BC's behaviour term, with the deployed policy as the behaviour).

Not a module of the learner: checkpoints and bundles hold the learner alone, and a fine-tuning run
rebuilds its anchor from the run it continues.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from q2real.agents.common.normalizer import ObsNormalizer


class Anchor:
    """`anchor(raw_obs)`: the anchored policy's deterministic action in [-1, 1]."""

    def __init__(self, policy: nn.Module, obs_norm: ObsNormalizer, weight: float):
        if not weight > 0:
            raise ValueError(f"an anchor's weight must be > 0, got {weight}")
        self.policy = copy.deepcopy(policy).requires_grad_(False).eval()
        self.obs_norm = copy.deepcopy(obs_norm)
        self.weight = weight

    @torch.no_grad()
    def __call__(self, raw_obs: torch.Tensor) -> torch.Tensor:
        return self.policy(self.obs_norm(raw_obs))

    @torch.no_grad()
    def hold(self, policy: dict[str, torch.Tensor], obs_norm: dict[str, torch.Tensor]) -> None:
        """Anchor to another version of the policy (one the robot judged good), from its saved states."""
        self.policy.load_state_dict(policy)
        self.obs_norm.load_state_dict(obs_norm)

    def penalty(self, action: torch.Tensor, raw_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """weight * E_s ||action(s) - anchor(s)||^2, and the mean |difference| per action dimension (in
        action units, as the node's shield counts changes) for the log."""
        difference = action - self(raw_obs)
        return self.weight * difference.square().sum(-1).mean(), difference.detach().abs().mean()
