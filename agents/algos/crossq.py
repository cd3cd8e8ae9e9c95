"""CrossQ (Bhatt, Palenicek et al., ICLR 2024, "CrossQ: Batch Normalization in Deep Reinforcement
Learning for Greater Sample Efficiency and Simplicity"): SAC without target networks, made stable by
batch renormalization in the critic and actor and one joint forward pass of (s, a) and (s', a'), so
the critic's normalization statistics are those of the mixture it is trained and bootstrapped on.
It reaches REDQ/DroQ sample efficiency at one update per transition, which is what a CPU can pay for.

Built from SAC and the shared loop's switches (`target_network=false`, `cross_batch`, the `renorm`
trunk, Adam's beta1); what CrossQ adds on top is when each network runs in training mode:
  - the bootstrap action a' ~ pi(s') comes from the actor in evaluation mode (running statistics);
  - the critic runs in training mode on the joint batch, the target half detached;
  - the actor's step runs the actor in training mode and the critic in evaluation mode.

Defaults follow the paper's preset (policy delay 3, lr 1e-3, Adam beta1 0.5, renorm warmup 100k
training passes, no target network). Departures: critics are 256 wide, not 2048 (a 2048-wide critic
costs about 64x per layer, what "Gait in Eight" (Bohlinger et al. 2025) also chose for CrossQ on a
CPU), and the initial temperature is SAC's 0.1 here, not 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from q2real.agents.algos.sac import SAC, SACConfig
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.networks import Trunk, set_renorm_warmup


@dataclass
class CrossQConfig(SACConfig):
    network: Trunk = "renorm"
    cross_batch: bool = True
    target_network: bool = False
    policy_delay: int = 3
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    adam_beta1: float = 0.5
    renorm_warmup: int = 100_000
    """Training passes each batch-renorm layer normalizes with batch statistics alone before it
    corrects towards the running ones (the paper's 100k; "Gait in Eight" used 1000 on a robot)."""
    normalize_obs: bool = False
    """The critic's and actor's first batch-renorm layer normalizes the input."""

    def checks(self) -> list[tuple[bool, str, str]]:
        return [*super().checks(), (self.renorm_warmup >= 0, "renorm_warmup", ">= 0")]


class CrossQ(SAC):
    config: CrossQConfig

    def __init__(self, config: CrossQConfig, sizes: Sizes):
        super().__init__(config, sizes)
        set_renorm_warmup(self, config.renorm_warmup)

    def target_action(self, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with _mode(self.actor, training=False):
            return super().target_action(next_obs)

    def actor_step(self, raw_obs: torch.Tensor) -> dict[str, torch.Tensor]:
        with _mode(self.critics(), training=False):
            return super().actor_step(raw_obs)


class _mode:
    """`module` in training or evaluation mode for the block, then back to the mode it had."""

    def __init__(self, module: nn.Module, training: bool):
        self.module, self.training = module, training

    def __enter__(self) -> None:
        self.was = self.module.training
        self.module.train(self.training)

    def __exit__(self, *exc) -> None:
        self.module.train(self.was)
