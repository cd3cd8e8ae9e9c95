"""GR1 standing: keep the Fourier GR1 humanoid upright and at standing height (PD position control, 50 Hz).

Held at its default pose by PD alone, the humanoid topples within about 1.5 s; the policy has to
balance it, also against pushes when the env randomizes them. Observation terms:
`base_angular_velocity` (base frame), `projected_gravity` (unit gravity in the base frame),
`joint_position` (32, offset from the default pose), `joint_velocity` (32).
Reward in [0, 1] per step, one term, `stand`: upright (tolerance on the tilt) x height (tolerance on
the base height around the standing height) x small base motion, so falling slowly earns less than
standing still.
Terminated when the base falls below `fall_height` of its standing height or tilts past `max_tilt`.
Reset: default pose at standing height, random heading, joint noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from q2real.sim.physics import PhysicsState
from q2real.sim.reward import RewardScales
from q2real.sim.task import tolerance
from q2real.sim.tasks.floating_base import FloatingBaseConfig, FloatingBaseTask


@dataclass
class GR1StandRewardScales(RewardScales):
    """The scale of `gr1_stand`'s reward term (and `gr1_legs_stand`'s)."""

    stand: float = 1.0
    """Upright x at standing height x small base motion, in [0, 1]. One term: a product, so a fallen
    robot earns nothing for holding still (a sum would pay it)."""


@dataclass
class GR1StandConfig(FloatingBaseConfig):
    episode_length: int = 500
    height_margin: float = 0.2
    """Height error (m) at which the height factor falls to 0.1."""
    tilt_margin: float = 0.5
    """Tilt (rad) at which the upright factor falls to 0.1."""
    motion_margin: float = 2.0
    """Base angular speed (rad/s) at which the small-motion factor falls to its floor (0.55)."""
    reward_scales: GR1StandRewardScales = field(default_factory=GR1StandRewardScales)


class GR1Stand(FloatingBaseTask):
    robot = "gr1"
    Config = GR1StandConfig
    config: GR1StandConfig

    def observation_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        return {
            "base_angular_velocity": self.base_angular_velocity(physics),
            "projected_gravity": self.projected_gravity(physics),
            "joint_position": self.joint_offsets(physics),
            "joint_velocity": physics.qvel[:, self.qvel_index],
        }

    def observation_sources(self) -> dict[str, dict]:
        return self.base_sources()

    def reward_terms(self, physics: PhysicsState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        c = self.config
        tilt = torch.acos((-self.projected_gravity(physics)[:, 2]).clamp(-1.0, 1.0))
        upright = tolerance(tilt, (0.0, 0.05), c.tilt_margin)
        height = tolerance(self.base_height(physics), (0.95 * self.height, 1.05 * self.height), c.height_margin)
        motion = self.base_angular_velocity(physics).norm(dim=-1)
        still = (1 + tolerance(motion, (0.0, 0.0), c.motion_margin)) / 2
        return {"stand": upright * height * still}
