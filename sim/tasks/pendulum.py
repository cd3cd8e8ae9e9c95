"""Pendulum swing-up: a torque-limited pendulum must pump energy, then balance upright.

Observation terms: `pole_orientation` (cos q, sin q; q = 0 hangs down), `pole_velocity` (q dot).
Reward in [0, 1], one term, `balance`: upright (1 - cos q) / 2, times dm_control's small-velocity and
small-control factors, so spinning through the top earns far less than balancing.
Cost: 1 while |q dot| exceeds the spec's velocity limit. No terminal states; episodes are truncated.
Reset: q ~ U(-pi, pi), q dot = 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from q2real.sim.physics import PhysicsState
from q2real.sim.reward import RewardScales
from q2real.sim.task import Task, TaskConfig, tolerance


@dataclass
class PendulumRewardScales(RewardScales):
    """The scale of `pendulum_swingup`'s reward term."""

    balance: float = 1.0
    """Upright (1 - cos q) / 2 times the small-velocity and small-control factors, in [0, 1]. One term:
    the factors discount being upright rather than add to it, so they are not terms of their own."""


@dataclass
class PendulumConfig(TaskConfig):
    episode_length: int = 500
    velocity_margin: float = 5.0
    """Angular speed (rad/s) at which the small-velocity factor falls to its floor."""
    reward_scales: PendulumRewardScales = field(default_factory=PendulumRewardScales)


class PendulumSwingup(Task):
    robot = "pendulum"
    Config = PendulumConfig
    robot_reward = True
    config: PendulumConfig

    def initial_state(self, num_envs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        qpos = self._uniform(gen, -math.pi, math.pi, (num_envs, 1))
        return qpos, torch.zeros_like(qpos)

    def observation_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        angle = physics.qpos[:, self.qpos_index]
        return {
            "pole_orientation": torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1),
            "pole_velocity": physics.qvel[:, self.qvel_index],
        }

    def observation_sources(self) -> dict[str, dict]:
        return {
            "pole_orientation": {"kind": "joint_position_cos_sin", "joints": ["hinge"]},
            "pole_velocity": {"kind": "joint_velocity", "joints": ["hinge"]},
        }

    def reward_terms(self, physics: PhysicsState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        angle = physics.qpos[:, self.qpos_index[0]]
        velocity = physics.qvel[:, self.qvel_index[0]]
        upright = (1 - torch.cos(angle)) / 2
        small_velocity = (1 + tolerance(velocity, (0.0, 0.0), self.config.velocity_margin)) / 2
        small_control = (4 + tolerance(action[:, 0], (0.0, 0.0), 1.0)) / 5
        return {"balance": upright * small_velocity * small_control}

    def cost(self, physics: PhysicsState, action: torch.Tensor) -> torch.Tensor:
        speed = physics.qvel[:, self.qvel_index[0]].abs()
        return (speed > self.spec.joints[0].velocity_limit).float()
