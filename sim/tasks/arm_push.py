"""Panda push: push a 5 cm cube on the floor to a target point with joint position commands (50 Hz).

The arm has no gripper here: a 2 cm sphere on the hand is the pusher. The target (x, y on the floor,
base frame) is the task's command. Observation terms: `joint_position` (7), `joint_velocity` (7),
`end_effector` (3, the pusher's position), `cube_position` (3), `target` (2). On a robot the pusher's
position comes from forward kinematics of the arm's model, the cube's from a tracker publishing
`object_pose` in the robot's base frame (`world` here: the arm stands at the origin) and the target
from the command input.
Reward in [0, 1] per step: the weighted mean of two terms, (reach + 4 push) / (1 + 4) with their
default `reward_scales`, where reach = 1 - tanh(|pusher - p| / scale) and push =
1 - tanh(|cube_xy - target| / scale), p being the cube's centre, or with `approach: behind` the point
where the pusher touches the cube's far side from the target (cube_xy - u (half size + pusher radius),
u the unit vector from cube to target, at the cube centre's height): from there a push moves the cube
toward the target, while the cube's centre pays as much for touching it from the side that pushes it
away.
With `sparse`, the reward is one term, `success`: 1 on the steps the cube's centre is within
`success_radius` of the target, else 0. Success: the cube was ever there. No terminal states.
Reset: home pose plus joint noise, cube uniform in a box in front of the robot, target uniform in a
larger box.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import mujoco
import torch

from q2real.hardware import RobotSpec
from q2real.sim.physics import PhysicsState
from q2real.sim.reward import RewardScales
from q2real.sim.task import Task, TaskConfig
from q2real.sim.tasks.arm_reach import END_EFFECTOR

CUBE_HALF_SIZE = 0.025
PUSHER_RADIUS = 0.02


@dataclass
class ArmPushRewardScales(RewardScales):
    """The scales of `panda_push`'s reward terms: `reach` and `push`, whose weighted mean the reward is,
    or `success` with `sparse`."""

    reach: float = 1.0
    """1 - tanh(|pusher - p| / distance_scale), p the cube's centre or the point behind it (`approach`):
    the pusher getting to the cube."""
    push: float = 4.0
    """1 - tanh(|cube_xy - target| / distance_scale): the cube getting to the target."""
    success: float = 1.0
    """sparse: 1 on the steps the cube is within `success_radius` of the target, else 0."""


@dataclass
class ArmPushConfig(TaskConfig):
    episode_length: int = 200
    action_scale: float | None = 1.0
    """rad around the home pose, as for reaching: clamped IK reaches as much of the floor under the
    target box as with the whole joint range."""
    cube_low: tuple[float, float] = (0.4, -0.15)
    """Lower corner (m, x and y on the floor, base frame) of the box the cube starts in, uniformly."""
    cube_high: tuple[float, float] = (0.6, 0.15)
    """Upper corner (m) of the cube's start box."""
    target_low: tuple[float, float] = (0.35, -0.3)
    """Lower corner (m, x and y on the floor, base frame) of the box the target is drawn from; the
    trained range a command on the robot must lie in."""
    target_high: tuple[float, float] = (0.7, 0.3)
    """Upper corner (m) of the target box."""
    distance_scale: float = 0.1
    """Distance (m) at which the reach and push terms have fallen to 1 - tanh(1) = 0.24."""
    joint_noise: float = 0.05
    """Std (rad) of the Gaussian noise on the home pose at reset."""
    approach: Literal["cube", "behind"] = "cube"
    """Where the reach term draws the pusher: the cube's centre, or the contact point behind it."""
    sparse: bool = False
    """Reward 1 only while the cube is within `success_radius` of the target, else 0."""
    success_radius: float = 0.05
    """m, cube centre to target on the floor."""
    reward_scales: ArmPushRewardScales = field(default_factory=ArmPushRewardScales)


class ArmPush(Task):
    robot = "panda"
    Config = ArmPushConfig
    config: ArmPushConfig
    command_dim = 2
    tracked_object = "cube"
    robot_reward = True

    def __init__(self, spec: RobotSpec, model: mujoco.MjModel, config: ArmPushConfig, device: torch.device):
        super().__init__(spec, model, config, device)
        self._ee = self.site_kinematics("pusher")
        cube = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, "cube")
        self._cube_q, self._cube_v = int(model.jnt_qposadr[cube]), int(model.jnt_dofadr[cube])

    @classmethod
    def scene(cls, mjspec: mujoco.MjSpec) -> None:
        hand = mjspec.site(END_EFFECTOR).parent
        hand.add_geom(
            name="pusher",
            type=mujoco.mjtGeom.mjGEOM_SPHERE,
            size=(PUSHER_RADIUS, 0, 0),
            pos=(0, 0, 0.04),
            contype=1,
            conaffinity=0,
            mass=0.05,
        )
        hand.add_site(name="pusher", pos=(0, 0, 0.04), size=(0.005, 0, 0))
        cube = mjspec.worldbody.add_body(name="cube", pos=(0.5, 0.0, CUBE_HALF_SIZE))
        cube.add_freejoint(name="cube")
        cube.add_geom(
            type=mujoco.mjtGeom.mjGEOM_BOX,
            size=(CUBE_HALF_SIZE,) * 3,
            mass=0.2,
            friction=(1.0, 0.005, 1e-4),
            contype=1,
            conaffinity=1,
            rgba=(0.8, 0.2, 0.2, 1),
        )

    def sample_command(self, num_envs: int, gen: torch.Generator) -> torch.Tensor:
        return self._uniform_box(gen, self.config.target_low, self.config.target_high, num_envs)

    def initial_state(self, num_envs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        qpos = torch.tensor(self.model.qpos0, dtype=torch.float32, device=self.device).repeat(num_envs, 1)
        qpos[:, self.qpos_index] = self.noisy_default_pose(gen, num_envs, self.config.joint_noise)
        c = self._cube_q
        qpos[:, c : c + 2] = self._uniform_box(gen, self.config.cube_low, self.config.cube_high, num_envs)
        qpos[:, c + 2] = CUBE_HALF_SIZE
        return qpos, torch.zeros(num_envs, self.model.nv, device=self.device)

    def cube_position(self, physics: PhysicsState) -> torch.Tensor:
        return physics.qpos[:, self._cube_q : self._cube_q + 3]

    def observation_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        return {
            "joint_position": physics.qpos[:, self.qpos_index],
            "joint_velocity": physics.qvel[:, self.qvel_index],
            "end_effector": self._ee(physics.qpos),
            "cube_position": self.cube_position(physics),
            "target": self.command,
        }

    def observation_sources(self) -> dict[str, dict]:
        joints = self.spec.joint_names
        return {
            "joint_position": {"kind": "joint_position", "joints": joints},
            "joint_velocity": {"kind": "joint_velocity", "joints": joints},
            "end_effector": self.site_point("pusher"),
            "cube_position": {"kind": "object_position", "frame_id": "world"},
            "target": self.command_source(self.config.target_low, self.config.target_high),
        }

    def figures(self) -> dict:
        """The cube's distance to the target is read from the observation; success is within the radius."""
        return {"within": self.config.success_radius}

    def success(self, physics: PhysicsState) -> torch.Tensor:
        distance = (self.cube_position(physics)[:, :2] - self.command).norm(dim=-1)
        return distance <= self.config.success_radius

    def approach_point(self, cube: torch.Tensor) -> torch.Tensor:
        """Where the reach term draws the pusher (`ArmPushConfig.approach`), (num_envs, 3)."""
        if self.config.approach == "cube":
            return cube
        away = self.command - cube[:, :2]
        unit = away / away.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        behind = cube[:, :2] - (CUBE_HALF_SIZE + PUSHER_RADIUS) * unit
        return torch.cat([behind, cube[:, 2:]], dim=-1)

    @property
    def mean_reward(self) -> bool:
        """The dense reward is the scales' weighted mean of reach and push, so it stays in [0, 1]."""
        return not self.config.sparse

    def reward_terms(self, physics: PhysicsState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.config.sparse:
            return {"success": self.success(physics).float()}
        cube = self.cube_position(physics)
        scale = self.config.distance_scale
        reach = 1 - torch.tanh((self._ee(physics.qpos) - self.approach_point(cube)).norm(dim=-1) / scale)
        push = 1 - torch.tanh((cube[:, :2] - self.command).norm(dim=-1) / scale)
        return {"reach": reach, "push": push}
