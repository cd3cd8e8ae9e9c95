"""Spot joystick: follow a commanded planar velocity on flat ground (PD position control, 50 Hz).

Command: forward and lateral speed (m/s) and yaw rate (rad/s) in the base frame, uniform in the
configured ranges, all three zero in `zero_command_share` of draws (standing still is a command too),
drawn at reset and again every `command_every` steps (5 s), as MuJoCo Playground's joystick tasks
resample theirs; on the robot it is `cmd_vel`. Observation terms:
`base_angular_velocity` (base frame), `projected_gravity` (unit gravity in the base frame),
`command` (3), `joint_position` (12, offset from the default stance) and `joint_velocity` (12): what
the robot's IMU and encoders give. The base's linear velocity is not observed, as in most legged
sim-to-real policies: a robot has it only from a state estimator whose drift the policy never met in
training; the reward still uses the simulator's true velocity.
Reward terms (MuJoCo Playground's joystick terms and names, without the gait shaping), with their
default scales: `tracking_lin_vel` exp(-|v_xy - cmd_xy|^2 / sigma) (1), `tracking_ang_vel`
exp(-(w_z - cmd_wz)^2 / sigma) (0.5), `lin_vel_z` v_z^2 (-2), `ang_vel_xy` |w_xy|^2 (-0.05) and
`orientation` |g_xy|^2 (-1), where g is the projected gravity.
Terminated when the base falls below `fall_height` of its standing height or tilts past `max_tilt`.
Reset: default stance at standing height, random heading, joint noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from q2real.configs.loader import ConfigError
from q2real.sim.physics import PhysicsState
from q2real.sim.reward import RewardScales
from q2real.sim.tasks.floating_base import FloatingBaseConfig, FloatingBaseTask


@dataclass
class SpotJoystickRewardScales(RewardScales):
    """The scales of `spot_joystick`'s reward terms, named as MuJoCo Playground's joystick tasks name them."""

    tracking_lin_vel: float = 1.0
    """exp(-|v_xy - cmd_xy|^2 / tracking_sigma): how well the base follows the commanded planar velocity."""
    tracking_ang_vel: float = 0.5
    """exp(-(w_z - cmd_wz)^2 / tracking_sigma): how well it follows the commanded yaw rate."""
    lin_vel_z: float = -2.0
    """v_z^2, (m/s)^2: the base bobbing up and down."""
    ang_vel_xy: float = -0.05
    """|w_xy|^2, (rad/s)^2: the base rolling and pitching."""
    orientation: float = -1.0
    """|g_xy|^2 of the projected gravity (0 upright): the base's tilt."""


@dataclass
class SpotJoystickConfig(FloatingBaseConfig):
    episode_length: int = 1000
    command_every: int = 250
    zero_command_share: float = 0.1
    """Share of command draws that are all zero: standing still is a command too."""
    forward_speed: tuple[float, float] = (-1.0, 1.0)
    """Range (m/s) the commanded forward speed is drawn from, uniformly."""
    lateral_speed: tuple[float, float] = (-0.5, 0.5)
    """Range (m/s) of the commanded lateral speed."""
    yaw_rate: tuple[float, float] = (-1.0, 1.0)
    """Range (rad/s) of the commanded yaw rate."""
    tracking_sigma: float = 0.25
    """Squared-error scale of the tracking rewards."""
    reward_scales: SpotJoystickRewardScales = field(default_factory=SpotJoystickRewardScales)


class SpotJoystick(FloatingBaseTask):
    robot = "spot"
    Config = SpotJoystickConfig
    config: SpotJoystickConfig
    command_dim = 3

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not 0 <= self.config.zero_command_share <= 1:
            share = self.config.zero_command_share
            raise ConfigError(f"env.task_params.zero_command_share: expected in [0, 1], got {share}")

    def sample_command(self, num_envs: int, gen: torch.Generator) -> torch.Tensor:
        c = self.config
        ranges = (c.forward_speed, c.lateral_speed, c.yaw_rate)
        command = torch.stack([self._uniform(gen, lo, hi, (num_envs,)) for lo, hi in ranges], dim=-1)
        moving = self._uniform(gen, 0.0, 1.0, (num_envs, 1)) >= c.zero_command_share
        return command * moving

    def observation_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        return {
            "base_angular_velocity": self.base_angular_velocity(physics),
            "projected_gravity": self.projected_gravity(physics),
            "command": self.command,
            "joint_position": self.joint_offsets(physics),
            "joint_velocity": physics.qvel[:, self.qvel_index],
        }

    def observation_sources(self) -> dict[str, dict]:
        c = self.config
        ranges = [list(c.forward_speed), list(c.lateral_speed), list(c.yaw_rate)]
        sources = self.base_sources()
        return sources | {"command": {"kind": "velocity_command", "ranges": ranges}}

    def reward_terms(self, physics: PhysicsState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        v, w, g = (
            self.base_linear_velocity(physics),
            self.base_angular_velocity(physics),
            self.projected_gravity(physics),
        )
        sigma = self.config.tracking_sigma
        return {
            "tracking_lin_vel": torch.exp(-((v[:, :2] - self.command[:, :2]) ** 2).sum(-1) / sigma),
            "tracking_ang_vel": torch.exp(-((w[:, 2] - self.command[:, 2]) ** 2) / sigma),
            "lin_vel_z": v[:, 2] ** 2,
            "ang_vel_xy": (w[:, :2] ** 2).sum(-1),
            "orientation": (g[:, :2] ** 2).sum(-1),
        }
