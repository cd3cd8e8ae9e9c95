"""What legged and humanoid tasks share: a free-floating base, its IMU-like readings and falling.

Base quantities come from the free joint's qpos/qvel (MuJoCo stores its linear velocity in the world
frame and its angular velocity in the body frame), so no sensor is needed and both backends agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import torch

from q2real.hardware import RobotSpec
from q2real.hardware.spec import SpecError
from q2real.hardware.stance import standing_height
from q2real.sim.physics import PhysicsState
from q2real.sim.task import Task, TaskConfig


def quat_rotate_inverse(quat: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
    """Express world-frame vectors (N, 3) in the frames of unit quaternions (N, 4), MuJoCo's (w, x, y, z)."""
    w, xyz = quat[:, :1], quat[:, 1:]
    t = 2 * torch.cross(xyz, vec, dim=-1)
    return vec - w * t + torch.cross(xyz, t, dim=-1)


@dataclass
class FloatingBaseConfig(TaskConfig):
    action_scale: float | None = 0.5
    """rad around the default pose, the scale legged position policies train with (MuJoCo Playground,
    Isaac Lab): a gait, not a jump across the joint range."""
    joint_noise: float = 0.05
    """Std (rad) of the Gaussian noise on the default joint pose at reset."""
    fall_height: float = 0.6
    """Terminate when the base drops below this fraction of its standing height."""
    max_tilt: float = 1.0
    """Terminate when the base tilts more than this (rad) from upright."""


class FloatingBaseTask(Task):
    """A robot whose first joint is a free joint, reset standing on its default pose with a random heading."""

    Config = FloatingBaseConfig
    config: FloatingBaseConfig

    def __init__(self, spec: RobotSpec, model: mujoco.MjModel, config: FloatingBaseConfig, device: torch.device):
        super().__init__(spec, model, config, device)
        free = [j for j in range(model.njnt) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
        if not free:
            raise SpecError(f"{spec.source}: {type(self).__name__} needs a robot with a free-floating base")
        self._free_joint = free[0]
        self._base_q, self._base_v = int(model.jnt_qposadr[free[0]]), int(model.jnt_dofadr[free[0]])
        qpos0 = model.qpos0.copy()
        qpos0[self.qpos_index.cpu().numpy()] = spec.array("default_position")
        self.height = standing_height(model, qpos0, self._base_q)
        """Base height when standing on the default pose."""
        self._qpos0 = torch.tensor(qpos0, dtype=torch.float32, device=device)

    def initial_state(self, num_envs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        qpos = self._qpos0.repeat(num_envs, 1)
        b = self._base_q
        qpos[:, b + 2] = self.height
        yaw = self._uniform(gen, -math.pi, math.pi, (num_envs,))
        qpos[:, b + 3], qpos[:, b + 6] = torch.cos(yaw / 2), torch.sin(yaw / 2)
        qpos[:, self.qpos_index] = self.noisy_default_pose(gen, num_envs, self.config.joint_noise)
        return qpos, torch.zeros(num_envs, self.model.nv, device=self.device)

    @property
    def push_body(self) -> int:
        return int(self.model.jnt_bodyid[self._free_joint])

    def base_height(self, physics: PhysicsState) -> torch.Tensor:
        return physics.qpos[:, self._base_q + 2]

    def base_quat(self, physics: PhysicsState) -> torch.Tensor:
        return physics.qpos[:, self._base_q + 3 : self._base_q + 7]

    def projected_gravity(self, physics: PhysicsState) -> torch.Tensor:
        """Unit gravity direction in the base frame: (0, 0, -1) when upright, what an IMU's tilt gives."""
        down = torch.tensor([0.0, 0.0, -1.0], device=self.device).expand(physics.qpos.shape[0], 3)
        return quat_rotate_inverse(self.base_quat(physics), down)

    def base_linear_velocity(self, physics: PhysicsState) -> torch.Tensor:
        """Base velocity in the base frame (m/s)."""
        world = physics.qvel[:, self._base_v : self._base_v + 3]
        return quat_rotate_inverse(self.base_quat(physics), world)

    def base_angular_velocity(self, physics: PhysicsState) -> torch.Tensor:
        """Base angular velocity in the base frame (rad/s), what a gyro reads."""
        return physics.qvel[:, self._base_v + 3 : self._base_v + 6]

    def joint_offsets(self, physics: PhysicsState) -> torch.Tensor:
        return physics.qpos[:, self.qpos_index] - self.default_pose

    def critic_terms(self, physics: PhysicsState) -> dict[str, torch.Tensor]:
        """What a robot knows only through a state estimator: the base's velocity (base frame) and height."""
        return {
            "base_linear_velocity": self.base_linear_velocity(physics),
            "base_height": self.base_height(physics)[:, None],
        }

    def figures(self) -> dict:
        """A fall, as training terminates on one, is a tilt past `max_tilt` (the node has no height)."""
        return {"fall_tilt": self.config.max_tilt}

    def base_sources(self) -> dict[str, dict]:
        """Robot-side sources of the terms every floating-base task observes: the base IMU's gravity and
        gyro (in the base frame through the spec's IMU mounting) and the joints around the default pose."""
        joints = self.spec.joint_names
        return {
            "base_angular_velocity": {"kind": "base_angular_velocity"},
            "projected_gravity": {"kind": "projected_gravity"},
            "joint_position": {
                "kind": "joint_position",
                "joints": joints,
                "offset": self.spec.array("default_position").tolist(),
            },
            "joint_velocity": {"kind": "joint_velocity", "joints": joints},
        }

    def terminated(self, physics: PhysicsState) -> torch.Tensor:
        fallen = self.base_height(physics) < self.config.fall_height * self.height
        tilted = self.projected_gravity(physics)[:, 2] > -math.cos(self.config.max_tilt)
        return fallen | tilted
