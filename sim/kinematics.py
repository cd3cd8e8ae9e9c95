"""Forward kinematics of a point on a fixed-base robot, batched in torch from joint positions.

A task that observes a point of the robot (an arm's end effector) computes it here from the state the
step ends in, as the deploy node does with `mj_kinematics` on its own model from the joint states it
measures (`q2real.deploy_ros.observation.Kinematics`). MuJoCo's sensors cannot stand in: a step
computes them before integrating its last substep, so a sensor read after a control period is one
substep older than the joints beside it in the observation.
"""

from __future__ import annotations

import mujoco
import numpy as np
import torch

from q2real.configs.loader import ConfigError


def _rotation(quat: np.ndarray) -> np.ndarray:
    matrix = np.empty(9)
    mujoco.mju_quat2Mat(matrix, quat)
    return matrix.reshape(3, 3)


def _axis_angle(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Rotation matrices (N, 3, 3) about a unit `axis` (3,) by `angle` (N,), Rodrigues' formula."""
    x, y, z = axis
    zero = torch.zeros((), dtype=axis.dtype, device=axis.device)
    cross = torch.stack([torch.stack([zero, -z, y]), torch.stack([z, zero, -x]), torch.stack([-y, x, zero])])
    sin, cos = torch.sin(angle)[:, None, None], torch.cos(angle)[:, None, None]
    return torch.eye(3, dtype=axis.dtype, device=axis.device) + sin * cross + (1 - cos) * (cross @ cross)


def _quat_matrix(quat: torch.Tensor) -> torch.Tensor:
    """Rotation matrices (N, 3, 3) of quaternions (N, 4), MuJoCo's (w, x, y, z), normalized first."""
    w, x, y, z = (quat / quat.norm(dim=-1, keepdim=True)).unbind(-1)
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ]
    return torch.stack([torch.stack(row, dim=-1) for row in rows], dim=-2)


class BodyPoint:
    """World position of a point `offset` fixed to `body`, for a batch of `qpos`, by MuJoCo's kinematics:
    each body on the chain from the world moves by its fixed pose in its parent, then by its joints in
    order (hinges turn about their anchor, slides shift along their axis, both from `qpos0`). With
    `floating`, a free joint on the chain places its body where `qpos` says (a legged robot's foot in the
    world, for a reward); the node observes points of fixed-base robots only."""

    def __init__(self, model: mujoco.MjModel, body: str, offset, device: torch.device, floating: bool = False):
        index = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body)
        if index < 0:
            raise ConfigError(f"forward kinematics: no body {body!r} in the model")
        chain = []
        while index > 0:
            chain.append(index)
            index = int(model.body_parentid[index])
        as_tensor = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32, device=device)  # noqa: E731
        self.links = []
        for b in reversed(chain):
            joints = []
            free = None
            for j in range(int(model.body_jntadr[b]), int(model.body_jntadr[b] + model.body_jntnum[b])):
                kind = int(model.jnt_type[j])
                if kind == mujoco.mjtJoint.mjJNT_FREE and floating:  # a free joint is its body's only one
                    free = int(model.jnt_qposadr[j])
                    continue
                if kind not in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE):
                    name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j)
                    raise ConfigError(f"forward kinematics: joint {name!r} is not a hinge or slide (a fixed base only)")
                adr = int(model.jnt_qposadr[j])
                hinge = kind == mujoco.mjtJoint.mjJNT_HINGE
                axis, anchor = as_tensor(model.jnt_axis[j]), as_tensor(model.jnt_pos[j])
                joints.append((hinge, adr, float(model.qpos0[adr]), axis, anchor))
            self.links.append((as_tensor(model.body_pos[b]), as_tensor(_rotation(model.body_quat[b])), joints, free))
        self.offset = as_tensor(offset)

    def __call__(self, qpos: torch.Tensor) -> torch.Tensor:
        """(N, 3) world positions for full-model `qpos` (N, nq), in float32 as the env's state."""
        qpos = qpos.float()
        n = qpos.shape[0]
        position = torch.zeros(n, 3, dtype=qpos.dtype, device=qpos.device)
        rotation = torch.eye(3, dtype=qpos.dtype, device=qpos.device).expand(n, 3, 3)
        for body_pos, body_rotation, joints, free in self.links:
            if free is not None:  # the body's pose in the world is the free joint's position
                position, rotation = qpos[:, free : free + 3], _quat_matrix(qpos[:, free + 3 : free + 7])
                continue
            position = position + rotation @ body_pos
            rotation = rotation @ body_rotation
            for hinge, adr, zero, axis, anchor in joints:
                angle = qpos[:, adr] - zero
                if hinge:
                    pivot = position + rotation @ anchor
                    rotation = rotation @ _axis_angle(axis, angle)
                    position = pivot - rotation @ anchor
                else:
                    position = position + (rotation @ axis) * angle[:, None]
        return position + rotation @ self.offset
