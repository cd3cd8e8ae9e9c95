"""Panda reach: move the end effector to a random target with joint position commands (50 Hz).

The target is the task's command: a point in the robot base frame, uniform in a box in front of the
robot, fixed for the episode; on a robot it arrives on the node's command input. Observation terms:
`joint_position` (7), `joint_velocity` (7), `target` (3). Reward in [0, 1] per step, one term, `reach`:
1 - tanh(d / scale) with d the end-effector-to-target distance, so the last centimetres still pay; with
`sparse`, one term, `success`: 1 on the steps the end effector is within `success_radius` of the
target, else 0. Success: it ever was. No terminal states.
Cost: with a keep-out box (`keepout_low`/`keepout_high`, base frame), 1 on every step the end effector
is inside it, else 0 (no box: always 0). Targets are not kept out of it: a policy may reach into it and
pay. `bench/safe.py` puts a 20 x 20 x 10 cm box above the home pose, across the straight path to the
targets above it: `keepout_low=[0.35,-0.1,0.28]`, `keepout_high=[0.55,0.1,0.38]`.
Reset: home pose plus joint noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import torch

from q2real.configs.loader import ConfigError
from q2real.hardware import RobotSpec
from q2real.sim.physics import PhysicsState
from q2real.sim.reward import RewardScales
from q2real.sim.task import Task, TaskConfig

END_EFFECTOR = "end_effector"
"""The arm's end-effector site, whose position forward kinematics gives (`Task.site_kinematics`)."""


@dataclass
class ArmReachRewardScales(RewardScales):
    """The scales of `panda_reach`'s reward terms: `reach`, or `success` with `sparse`."""

    reach: float = 1.0
    """1 - tanh(d / distance_scale), d the end effector's distance to the target: in [0, 1]."""
    success: float = 1.0
    """sparse: 1 on the steps the end effector is within `success_radius` of the target, else 0."""


@dataclass
class ArmReachConfig(TaskConfig):
    episode_length: int = 100
    action_scale: float | None = 1.0
    """rad around the home pose: every target of the box the whole joint range reaches stays reachable
    (measured: 95 % within 2 cm by clamped IK, as with the whole range; 0.5 rad reaches 76 %)."""
    target_low: tuple[float, float, float] = (0.3, -0.3, 0.2)
    """Lower corner (m) of the target box in the base frame."""
    target_high: tuple[float, float, float] = (0.6, 0.3, 0.6)
    """Upper corner (m) of the target box; targets are uniform in the box, the range a command on the
    robot must lie in."""
    distance_scale: float = 0.2
    """Distance (m) at which the reward has fallen to 1 - tanh(1) = 0.24."""
    joint_noise: float = 0.1
    """Std (rad) of the Gaussian noise on the home pose at reset."""
    sparse: bool = False
    """Reward 1 only while the end effector is within `success_radius` of the target, else 0."""
    success_radius: float = 0.05
    """m, end effector to target."""
    keepout_low: tuple[float, float, float] | None = None
    """Lower corner (m, base frame) of the box the end effector should stay out of; None: no box."""
    keepout_high: tuple[float, float, float] | None = None
    """Upper corner (m, base frame) of the keep-out box; give both corners or neither."""
    reward_scales: ArmReachRewardScales = field(default_factory=ArmReachRewardScales)


class ArmReach(Task):
    robot = "panda"
    Config = ArmReachConfig
    config: ArmReachConfig
    command_dim = 3
    robot_reward = True

    def __init__(self, spec: RobotSpec, model: mujoco.MjModel, config: ArmReachConfig, device: torch.device):
        super().__init__(spec, model, config, device)
        self._ee = self.site_kinematics(END_EFFECTOR)
        low, high = config.keepout_low, config.keepout_high
        if (low is None) != (high is None):
            raise ConfigError("env.task_params.keepout_low/keepout_high: give both corners of the box, or neither")
        self._keepout = None
        if low is not None and high is not None:
            if len(low) != 3 or len(high) != 3 or not all(lo < hi for lo, hi in zip(low, high, strict=True)):
                raise ConfigError(
                    f"env.task_params.keepout_low: expected 3 numbers each below keepout_high's, got {low} and {high}"
                )
            self._keepout = torch.tensor([low, high], dtype=torch.float32, device=device)

    def sample_command(self, num_envs: int, gen: torch.Generator) -> torch.Tensor:
        return self._uniform_box(gen, self.config.target_low, self.config.target_high, num_envs)

    def initial_state(self, num_envs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        qpos = self.noisy_default_pose(gen, num_envs, self.config.joint_noise)
        return qpos, torch.zeros_like(qpos)

    def observation_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        return {
            "joint_position": physics.qpos[:, self.qpos_index],
            "joint_velocity": physics.qvel[:, self.qvel_index],
            "target": self.command,
        }

    def observation_sources(self) -> dict[str, dict]:
        joints = self.spec.joint_names
        return {
            "joint_position": {"kind": "joint_position", "joints": joints},
            "joint_velocity": {"kind": "joint_velocity", "joints": joints},
            "target": self.command_source(self.config.target_low, self.config.target_high),
        }

    def figures(self) -> dict:
        """The end effector by forward kinematics on the robot, and success within the radius."""
        return {"point": self.site_point(END_EFFECTOR), "within": self.config.success_radius}

    def distance(self, physics: PhysicsState) -> torch.Tensor:
        return (self._ee(physics.qpos) - self.command).norm(dim=-1)

    def success(self, physics: PhysicsState) -> torch.Tensor:
        return self.distance(physics) <= self.config.success_radius

    @property
    def has_cost(self) -> bool:
        return self._keepout is not None

    def cost(self, physics: PhysicsState, action: torch.Tensor) -> torch.Tensor:
        if self._keepout is None:
            return super().cost(physics, action)
        ee = self._ee(physics.qpos)
        return ((ee > self._keepout[0]) & (ee < self._keepout[1])).all(-1).float()

    def reward_terms(self, physics: PhysicsState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.config.sparse:
            return {"success": self.success(physics).float()}
        return {"reach": 1 - torch.tanh(self.distance(physics) / self.config.distance_scale)}
