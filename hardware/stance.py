"""How a floating-base robot stands: the base height at which its default pose just touches the floor.

Training resets and the sim-in-the-loop robot both start a legged robot standing there, so a policy
meets the same first state in either.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np


def standing_height(model: mujoco.MjModel, qpos: np.ndarray, free_qpos: int) -> float:
    """Height of the root body at which the lowest collision geom of pose `qpos` just touches z = 0."""
    data = mujoco.MjData(model)
    data.qpos[:] = qpos
    data.qpos[free_qpos : free_qpos + 3] = 0.0
    mujoco.mj_kinematics(model, data)
    lowest = math.inf
    for g in range(model.ngeom):
        if model.geom_bodyid[g] == 0 or not (model.geom_contype[g] or model.geom_conaffinity[g]):
            continue
        kind, size, z_axis = model.geom_type[g], model.geom_size[g], data.geom_xmat[g].reshape(3, 3)[2]
        if kind == mujoco.mjtGeom.mjGEOM_SPHERE:
            extent = size[0]
        elif kind == mujoco.mjtGeom.mjGEOM_CAPSULE:
            extent = abs(z_axis[2]) * size[1] + size[0]
        elif kind == mujoco.mjtGeom.mjGEOM_BOX:
            extent = float(np.abs(z_axis) @ size)
        else:
            extent = model.geom_rbound[g]
        lowest = min(lowest, data.geom_xpos[g, 2] - extent)
    return -lowest + 1e-3
