"""FlashSAC (Kim et al. 2026, "FlashSAC"): SAC with bounded norms, a categorical critic and
temporally repeated exploration noise, built from SAC plus switches rather than a second learner.

What changes against SAC, each a piece of `ActorCritic`/`SAC`:
  - network `flash`: BatchNorm + unit-norm embedding, inverted-residual blocks (h -> 4h -> h), RMSNorm;
  - `project_weights`: weight rows back to unit norm and norm scales to sqrt(d) after every step;
  - categorical critic with 101 atoms on [-5, 5] and return-based reward scaling (`scale_rewards`);
  - `noise_repeat`: exploration noise held for k ~ Zeta(2) steps, k <= 16;
  - temperature from a target action std of 0.15, actor updated every 2 critic updates.
  - `cross_batch`: online and target critics see (s, a) and (s', a') as one batch, so BatchNorm
    statistics are shared between predictions and their targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from q2real.agents.algos.sac import SACConfig
from q2real.agents.common.networks import Trunk


@dataclass
class FlashSACConfig(SACConfig):
    network: Trunk = "flash"
    actor_hidden: tuple[int, ...] = (128, 128)
    critic_hidden: tuple[int, ...] = (256, 256)
    critic_head: Literal["scalar", "categorical", "quantile"] = "categorical"
    num_atoms: int = 101
    v_min: float = -5.0
    v_max: float = 5.0
    scale_rewards: bool = True
    project_weights: bool = True
    cross_batch: bool = True
    noise_repeat: bool = True
    init_alpha: float = 0.01
    target_action_std: float | None = 0.15
    log_std_min: float = -10.0
    policy_delay: int = 2
    tau: float = 0.01
    batch_size: int = 512
