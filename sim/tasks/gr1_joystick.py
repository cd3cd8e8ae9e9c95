"""GR1 joystick: walk on a commanded planar velocity, `spot_joystick`'s task on the humanoid's legs
(`gr1_legs`: waist and legs actuated, head and arms held at their pose; PD position control, 50 Hz).

Command and observation as `spot_joystick`: forward speed, lateral speed and yaw rate in the base frame,
here uniform in [-0.5, 1.0] m/s, [-0.3, 0.3] m/s and [-0.8, 0.8] rad/s, all zero in
`zero_command_share` (10 %) of draws, redrawn every `command_every` steps (5 s) in 20 s episodes; the
policy sees the base's angular velocity and projected gravity, the command, and the 15 joints'
positions (around the default pose) and velocities: what the robot's IMU, encoders and `cmd_vel` give.

A biped must step where a quadruped may shuffle, so beside `spot_joystick`'s terms (tracking of the
planar velocity and yaw rate, vertical bobbing, roll and pitch rates, tilt) the reward pays for steps
and stance as the published humanoid joystick tasks do (legged_gym, MuJoCo Playground's G1 and T1),
each with its default scale:

- `tracking_lin_vel` exp(-|v_xy - cmd_xy|^2 / sigma) (1), `tracking_ang_vel` exp(-(w_z - cmd_z)^2 /
  sigma) (0.5), `lin_vel_z` v_z^2 (-2), `ang_vel_xy` |w_xy|^2 (-0.05), `orientation` |g_xy|^2 (-5);
- `base_height` (h - standing height)^2, m^2 (-10);
- `feet_air_time`: at each foot's touchdown, its time in the air (s) less `air_time_target` (0.4 s),
  summed over the feet, paid only while the command asks to move (1);
- `feet_slip`: the squared horizontal speed (m/s)^2 of each foot on the ground, summed (-0.25);
- `action_rate` |a_t - a_{t-1}|^2 of the actions reaching the actuators (-0.01);
- `joint_limits`: how far (rad) each joint is past `soft_limit` (90 %) of its range, summed (-1);
- `stand_still`: with a zero command, |q - q_default| summed over joints, rad (-0.1).

Feet: the `left_foot` and `right_foot` bodies, placed by forward kinematics from the base pose and the
joints; a foot is on the ground while its body is within `contact_height` (2 cm) of where it stands on
the default pose, and its speed is its move over the control period. Terminated on a fall as every
floating-base task (base below `fall_height` of its standing height, or tilted past `max_tilt`).
Reset: default pose at standing height, random heading, joint noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from q2real.sim.kinematics import BodyPoint
from q2real.sim.physics import PhysicsState
from q2real.sim.tasks.spot_joystick import SpotJoystick, SpotJoystickConfig, SpotJoystickRewardScales

FEET = ("left_foot", "right_foot")


@dataclass
class GR1JoystickRewardScales(SpotJoystickRewardScales):
    """The scales of `gr1_joystick`'s reward terms: `spot_joystick`'s, then the humanoid's."""

    orientation: float = -5.0
    """|g_xy|^2 of the projected gravity (0 upright): a biped's tilt is the start of a fall."""
    base_height: float = -10.0
    """(h - standing height)^2, m^2: walking upright, not crouched."""
    feet_air_time: float = 1.0
    """Sum over the feet touching down of (time in the air - air_time_target), s, while asked to move."""
    feet_slip: float = -0.25
    """Sum over the feet on the ground of their squared horizontal speed, (m/s)^2."""
    action_rate: float = -0.01
    """|a_t - a_{t-1}|^2 of the actions reaching the actuators."""
    joint_limits: float = -1.0
    """Sum over joints of how far (rad) each is past `soft_limit` of its range."""
    stand_still: float = -0.1
    """With a zero command, the sum over joints of |q - q_default|, rad."""


@dataclass
class GR1JoystickConfig(SpotJoystickConfig):
    forward_speed: tuple[float, float] = (-0.5, 1.0)
    lateral_speed: tuple[float, float] = (-0.3, 0.3)
    yaw_rate: tuple[float, float] = (-0.8, 0.8)
    air_time_target: float = 0.4
    """Seconds in the air at which a step starts to pay (`feet_air_time`)."""
    contact_height: float = 0.02
    """A foot is on the ground while within this (m) of its height standing on the default pose."""
    soft_limit: float = 0.9
    """Share of each joint's range, around its middle, past which `joint_limits` charges."""
    reward_scales: GR1JoystickRewardScales = field(default_factory=GR1JoystickRewardScales)


class GR1Joystick(SpotJoystick):
    robot = "gr1_legs"
    Config = GR1JoystickConfig
    config: GR1JoystickConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.feet = [BodyPoint(self.model, foot, [0.0, 0.0, 0.0], self.device, floating=True) for foot in FEET]
        standing = self._qpos0.clone()
        standing[self._base_q + 2] = self.height
        self.foot_rest = torch.stack([foot(standing[None])[0, 2] for foot in self.feet])
        """Each foot body's height standing on the default pose (m)."""
        middle, half = (self.joint_high + self.joint_low) / 2, (self.joint_high - self.joint_low) / 2
        self.soft_low, self.soft_high = middle - self.config.soft_limit * half, middle + self.config.soft_limit * half
        self.period = self.spec.control_period
        self._memory: dict[str, torch.Tensor] = {}

    def feet_position(self, physics: PhysicsState) -> torch.Tensor:
        """(num_envs, 2, 3) world positions of the feet bodies."""
        return torch.stack([foot(physics.qpos) for foot in self.feet], dim=1)

    def on_ground(self, feet: torch.Tensor) -> torch.Tensor:
        """(num_envs, 2) whether each foot is within `contact_height` of its standing height."""
        return feet[..., 2] < self.foot_rest + self.config.contact_height

    def reset_memory(self, mask: torch.Tensor, physics: PhysicsState) -> None:
        feet = self.feet_position(physics)
        n, feet_count = feet.shape[:2]
        fresh = {
            "feet": feet,
            "contact": self.on_ground(feet),
            "air_time": torch.zeros(n, feet_count, device=self.device),
            "landed": torch.zeros(n, feet_count, device=self.device),
            "foot_speed": torch.zeros(n, feet_count, device=self.device),
            "action": torch.zeros(n, self.action_dim, device=self.device),
            "action_change": torch.zeros(n, self.action_dim, device=self.device),
        }
        if not self._memory:
            self._memory = fresh
            return
        for key, value in fresh.items():
            rows = mask.view(-1, *([1] * (value.dim() - 1)))
            self._memory[key] = torch.where(rows, value, self._memory[key])

    def advance(self, physics: PhysicsState, action: torch.Tensor) -> None:
        m = self._memory
        feet = self.feet_position(physics)
        contact = self.on_ground(feet)
        air_time = m["air_time"] + self.period
        m["landed"] = torch.where(contact & ~m["contact"], air_time, 0.0)
        m["air_time"] = torch.where(contact, 0.0, air_time)
        m["foot_speed"] = (feet - m["feet"])[..., :2].norm(dim=-1) / self.period
        m["feet"], m["contact"] = feet, contact
        m["action_change"], m["action"] = action - m["action"], action

    def memory(self) -> dict[str, torch.Tensor]:
        return dict(self._memory)

    def load_memory(self, memory: dict[str, torch.Tensor]) -> None:
        self._memory |= memory

    def reward_terms(self, physics: PhysicsState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        m, c = self._memory, self.config
        moving = (self.command.abs() > 0.1).any(dim=-1)
        q = physics.qpos[:, self.qpos_index]
        landed = m["landed"]
        beyond = (q - self.soft_high).clamp(min=0) + (self.soft_low - q).clamp(min=0)
        return super().reward_terms(physics, action) | {
            "base_height": (self.base_height(physics) - self.height) ** 2,
            "feet_air_time": torch.where(landed > 0, landed - c.air_time_target, 0.0).sum(-1) * moving,
            "feet_slip": (m["contact"] * m["foot_speed"] ** 2).sum(-1),
            "action_rate": (m["action_change"] ** 2).sum(-1),
            "joint_limits": beyond.sum(-1),
            "stand_still": (q - self.default_pose).abs().sum(-1) * ~moving,
        }
