"""Velocity-constrained running (Safety-Gymnasium's velocity suite) on gymnasium's v5 MuJoCo models.

`hopper_velocity`, `walker2d_velocity` and `half_cheetah_velocity` run gymnasium's Hopper, Walker2d and
HalfCheetah models (hardware/, as gymnasium 1.4.0 ships them) on q2real's batched backends, with the v5
envs' observation, reward, termination and reset, and Safety-Gymnasium's cost: 1 on every step the
forward speed exceeds the robot's threshold (Hopper 0.7402, Walker2d 2.3415, HalfCheetah 3.2096 m/s;
OmniSafe's benchmark allows an episode cost of 25 over 1000 steps).

Observation terms: `pose` (every qpos but the forward position), `velocity` (every qvel, clipped to
+-10 for Hopper and Walker2d as v5 does). Reward terms: `forward` (the forward speed), `healthy` (1
while healthy; scale 1 for Hopper and Walker2d, 0 for HalfCheetah) and `control` (|a|^2; scale -1e-3,
HalfCheetah -0.1). Terminated once unhealthy: Hopper below 0.7 m, tilted past 0.2 rad or with a state
entry beyond 100; Walker2d outside 0.8-2 m or tilted past 1 rad; HalfCheetah never. Reset: the model's
rest pose plus uniform noise (5e-3; HalfCheetah 0.1, its velocities Gaussian). The forward speed is the
root's x velocity after the step, where gymnasium differences the x position over the step. MuJoCo's
native backend only: the models integrate with RK4, which MJX does not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import torch

from q2real.hardware import RobotSpec
from q2real.sim.physics import PhysicsState
from q2real.sim.reward import RewardScales
from q2real.sim.task import Task, TaskConfig


@dataclass
class VelocityRewardScales(RewardScales):
    """The scales of the velocity runners' reward terms (gymnasium v5's forward reward, healthy reward and
    control cost)."""

    forward: float = 1.0
    """Forward speed (m/s) of the root."""
    healthy: float = 1.0
    """1 on every step the robot is healthy (upright, in its height range), else 0: an alive bonus."""
    control: float = -1e-3
    """|a|^2, the squared actions summed over joints: a control cost."""


@dataclass
class VelocityConfig(TaskConfig):
    episode_length: int = 1000
    velocity_threshold: float = 0.0
    """Forward speed (m/s) above which a step costs 1; each task sets Safety-Gymnasium's."""
    reward_scales: VelocityRewardScales = field(default_factory=VelocityRewardScales)
    reset_noise: float = 5e-3
    """Half-width of the uniform noise on the rest pose and velocities at reset (HalfCheetah's
    velocities: the std of Gaussian noise)."""


@dataclass
class HopperConfig(VelocityConfig):
    velocity_threshold: float = 0.7402


@dataclass
class Walker2dConfig(VelocityConfig):
    velocity_threshold: float = 2.3415


@dataclass
class HalfCheetahConfig(VelocityConfig):
    velocity_threshold: float = 3.2096
    reset_noise: float = 0.1
    reward_scales: VelocityRewardScales = field(default_factory=lambda: VelocityRewardScales(healthy=0.0, control=-0.1))


class PlanarRunner(Task):
    """A planar robot on gymnasium's root joints rootx (slide), rootz (slide), rooty (hinge)."""

    Config: type[VelocityConfig] = VelocityConfig
    config: VelocityConfig
    native_only = True
    healthy_z: tuple[float, float] | None = None
    """Healthy torso height range; None: the robot never falls (no termination)."""
    healthy_angle: float = 0.0
    state_bound: float | None = None
    clip_velocity: float | None = 10.0

    def __init__(self, spec: RobotSpec, model: mujoco.MjModel, config: VelocityConfig, device: torch.device):
        super().__init__(spec, model, config, device)
        self._qpos0 = torch.tensor(model.qpos0, dtype=torch.float32, device=device)

    def initial_state(self, num_envs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        noise, nq, nv = self.config.reset_noise, self.model.nq, self.model.nv
        qpos = self._qpos0 + self._uniform(gen, -noise, noise, (num_envs, nq))
        return qpos, self._uniform(gen, -noise, noise, (num_envs, nv))

    def observation_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        velocity = physics.qvel
        if self.clip_velocity is not None:
            velocity = velocity.clamp(-self.clip_velocity, self.clip_velocity)
        return {"pose": physics.qpos[:, 1:], "velocity": velocity}

    def forward_speed(self, physics: PhysicsState) -> torch.Tensor:
        return physics.qvel[:, 0]

    def healthy(self, physics: PhysicsState) -> torch.Tensor:
        ok = torch.ones(physics.qpos.shape[0], dtype=torch.bool, device=self.device)
        if self.healthy_z is not None:
            z, angle = physics.qpos[:, 1], physics.qpos[:, 2]
            ok = (z > self.healthy_z[0]) & (z < self.healthy_z[1]) & (angle.abs() < self.healthy_angle)
        if self.state_bound is not None:
            state = torch.cat([physics.qpos[:, 2:], physics.qvel], dim=-1)
            ok = ok & (state.abs() < self.state_bound).all(-1)
        return ok

    def reward_terms(self, physics: PhysicsState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "forward": self.forward_speed(physics),
            "healthy": self.healthy(physics).float(),
            "control": action.pow(2).sum(-1),
        }

    def cost(self, physics: PhysicsState, action: torch.Tensor) -> torch.Tensor:
        return (self.forward_speed(physics) > self.config.velocity_threshold).float()

    def terminated(self, physics: PhysicsState) -> torch.Tensor:
        if self.healthy_z is None:
            return super().terminated(physics)
        return ~self.healthy(physics)


class HopperVelocity(PlanarRunner):
    robot = "hopper"
    Config = HopperConfig
    healthy_z = (0.7, float("inf"))
    healthy_angle = 0.2
    state_bound = 100.0


class Walker2dVelocity(PlanarRunner):
    robot = "walker2d"
    Config = Walker2dConfig
    healthy_z = (0.8, 2.0)
    healthy_angle = 1.0


class HalfCheetahVelocity(PlanarRunner):
    robot = "half_cheetah"
    Config = HalfCheetahConfig
    clip_velocity = None

    def initial_state(self, num_envs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        noise = self.config.reset_noise
        qpos = self._qpos0 + self._uniform(gen, -noise, noise, (num_envs, self.model.nq))
        return qpos, self._normal(gen, noise, (num_envs, self.model.nv))
