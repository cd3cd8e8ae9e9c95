"""Cartpole swing-up (dm_control-like): swing the pole up from hanging and balance it centred.

Observation terms: `cart_position`, `pole_orientation` (cos, sin; 0 = upright), `velocities`
(cart, pole). Reward in [0, 1], one term, `balance`: dm_control's product upright (cos + 1) / 2 x
centred x small control x small velocity.

With `sparse`, one term, `success`: 1 on the steps the pole is upright (cos >= `upright_cosine`) with the
cart within `sparse_cart_range` of the centre, else 0 (dm_control's swingup_sparse uses 0.995 and
0.25). Nothing guides the swing, so a sparse episode starts with the pole at a uniformly random
angle: some starts see reward at once and the value of being upright spreads back from there. From
hanging alone, per-step random actions never found the top (0 of 64 episodes of 500 steps).
Success: the pole was ever upright in the sparse sense.

Cost: 1 while the cart is beyond `cost_fraction` of the rail's position limit. Terminated when the
cart reaches the end stop of the rail (the spec's slider limit), which on a real rail is a crash.
Reset: cart near 0, pole near hanging (uniform with `sparse`), small noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mujoco
import torch

from q2real.hardware import RobotSpec
from q2real.sim.physics import PhysicsState
from q2real.sim.reward import RewardScales
from q2real.sim.task import Task, TaskConfig, tolerance


@dataclass
class CartpoleRewardScales(RewardScales):
    """The scales of `cartpole_swingup`'s reward terms: `balance`, or `success` with `sparse`."""

    balance: float = 1.0
    """dm_control's product of upright, centred, small control and small velocity, in [0, 1]. One term:
    the factors discount being upright rather than add to it."""
    success: float = 1.0
    """sparse: 1 on the steps the pole is upright with the cart centred, else 0."""


@dataclass
class CartpoleConfig(TaskConfig):
    episode_length: int = 1000
    reset_noise: float = 0.01
    """Std of the Gaussian noise on the initial cart position, pole angle and velocities."""
    end_stop_margin: float = 0.05
    """Distance (m) from the rail's limit at which the episode terminates."""
    cost_fraction: float = 0.75
    """Fraction of the rail limit beyond which each step costs 1."""
    cart_margin: float = 2.0
    """Cart offset (m) at which the centred factor falls to its floor."""
    pole_velocity_margin: float = 5.0
    """Pole speed (rad/s) at which the small-velocity factor falls to its floor."""
    sparse: bool = False
    """Reward 1 only while upright and centred (see the module docstring), else 0."""
    upright_cosine: float = 0.95
    """sparse: the pole counts as upright while the cosine of its angle from vertical is at least this."""
    sparse_cart_range: float = 0.5
    """sparse: how far (m) from the centre the cart may be while the upright pole pays."""
    reward_scales: CartpoleRewardScales = field(default_factory=CartpoleRewardScales)


class CartpoleSwingup(Task):
    robot = "cartpole"
    Config = CartpoleConfig
    config: CartpoleConfig

    def __init__(self, spec: RobotSpec, model: mujoco.MjModel, config: CartpoleConfig, device: torch.device):
        super().__init__(spec, model, config, device)
        hinge = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, "hinge")
        self._pole_q, self._pole_v = int(model.jnt_qposadr[hinge]), int(model.jnt_dofadr[hinge])
        self._cart_q, self._cart_v = int(self.qpos_index[0]), int(self.qvel_index[0])
        self._rail_limit = spec.joints[0].position_limits[1]

    def initial_state(self, num_envs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        noise = self.config.reset_noise
        qpos = self._normal(gen, noise, (num_envs, self.model.nq))
        if self.config.sparse:
            qpos[:, self._pole_q] += self._uniform(gen, -math.pi, math.pi, (num_envs,))
        else:
            qpos[:, self._pole_q] += math.pi
        return qpos, self._normal(gen, noise, (num_envs, self.model.nv))

    def observation_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        angle = physics.qpos[:, self._pole_q : self._pole_q + 1]
        return {
            "cart_position": physics.qpos[:, self._cart_q : self._cart_q + 1],
            "pole_orientation": torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1),
            "velocities": physics.qvel[:, [self._cart_v, self._pole_v]],
        }

    def observation_sources(self) -> dict[str, dict]:
        return {
            "cart_position": {"kind": "joint_position", "joints": ["slider"]},
            "pole_orientation": {"kind": "joint_position_cos_sin", "joints": ["hinge"]},
            "velocities": {"kind": "joint_velocity", "joints": ["slider", "hinge"]},
        }

    def success(self, physics: PhysicsState) -> torch.Tensor:
        c = self.config
        upright = torch.cos(physics.qpos[:, self._pole_q]) >= c.upright_cosine
        return upright & (physics.qpos[:, self._cart_q].abs() <= c.sparse_cart_range)

    def reward_terms(self, physics: PhysicsState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.config.sparse:
            return {"success": self.success(physics).float()}
        upright = (torch.cos(physics.qpos[:, self._pole_q]) + 1) / 2
        c = self.config
        centered = (1 + tolerance(physics.qpos[:, self._cart_q], (0.0, 0.0), c.cart_margin)) / 2
        small_control = (4 + tolerance(action[:, 0], (0.0, 0.0), 1.0)) / 5
        small_velocity = (1 + tolerance(physics.qvel[:, self._pole_v], (0.0, 0.0), c.pole_velocity_margin)) / 2
        return {"balance": upright * centered * small_control * small_velocity}

    def cost(self, physics: PhysicsState, action: torch.Tensor) -> torch.Tensor:
        return (physics.qpos[:, self._cart_q].abs() > self.config.cost_fraction * self._rail_limit).float()

    def terminated(self, physics: PhysicsState) -> torch.Tensor:
        return physics.qpos[:, self._cart_q].abs() >= self._rail_limit - self.config.end_stop_margin
