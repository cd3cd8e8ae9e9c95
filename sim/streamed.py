"""A task's view of a robot, rebuilt from what the deploy node streams, so the task's own reward and
termination run on the robot's transitions (`q2real.agents.onrobot.robot_learner`): one reward definition
for simulation and robot.

Each tick the node streams the actuated joints' positions and velocities and the observation it gave
the policy, which carries the task's command (a reach target) and the tracked object's position (the
pushed cube, from the pose input). Everything else in the model is at its reference pose and at
rest. Sensors (an end effector's `framepos`) are computed by MuJoCo's forward pass from that state:
forward kinematics on this machine's model of the robot. The rows arrive on the host, so the forward
pass runs there, row by row, off the control loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import mujoco
import numpy as np
import torch

from q2real.configs.loader import ConfigError
from q2real.sim.physics import PhysicsState
from q2real.sim.task import Task


class StreamedState:
    """`task`'s PhysicsState and command for rows of (joint positions, joint velocities, observation),
    the observation laid out as `names`, `dims` and `sources` (the env's, which the bundle carries)."""

    def __init__(self, task: Task, names: Sequence[str], dims: Sequence[int], sources: Sequence[dict] | None):
        if not task.robot_reward or sources is None:
            raise ConfigError(
                f"task {type(task).__name__}: its reward reads more than joint states, the command and a "
                "tracked object's position, so it cannot be computed on the robot (Task.robot_reward)"
            )
        self.task, model = task, task.model
        starts = np.cumsum([0, *dims])
        spans = {
            source["kind"]: slice(int(a), int(b)) for source, a, b in zip(sources, starts[:-1], starts[1:], strict=True)
        }
        self._command = spans.get("command")
        if task.command_dim and self._command is None:
            raise ConfigError(f"task {type(task).__name__}: no 'command' term in its observation carries the command")
        self._object, self._object_q = spans.get("object_position"), None
        if task.tracked_object is not None:
            body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, task.tracked_object)
            if self._object is None or body < 0 or model.body_jntnum[body] != 1:
                raise ConfigError(
                    f"task {type(task).__name__}: the tracked object {task.tracked_object!r} needs an "
                    "'object_position' observation term and a body with one free joint"
                )
            self._object_q = int(model.jnt_qposadr[model.body_jntadr[body]])
        self._model, self._data = model, mujoco.MjData(model)
        self._qpos0 = np.asarray(model.qpos0, dtype=np.float64)
        self._qpos_index = task.qpos_index.cpu().numpy()
        self._qvel_index = task.qvel_index.cpu().numpy()

    def physics(self, q: np.ndarray, qd: np.ndarray, obs: np.ndarray) -> PhysicsState:
        model, data, n = self._model, self._data, len(q)
        qpos = np.repeat(self._qpos0[None], n, axis=0)
        qvel = np.zeros((n, model.nv))
        qpos[:, self._qpos_index], qvel[:, self._qvel_index] = q, qd
        if self._object_q is not None and self._object is not None:
            qpos[:, self._object_q : self._object_q + 3] = obs[:, self._object]
        sensors = np.zeros((n, model.nsensordata))
        for i in range(n if model.nsensordata else 0):
            data.qpos[:], data.qvel[:] = qpos[i], qvel[i]
            mujoco.mj_forward(model, data)
            sensors[i] = data.sensordata
        device = self.task.device
        return PhysicsState(*(torch.from_numpy(a).float().to(device) for a in (qpos, qvel, sensors)))

    def reward(
        self, q: np.ndarray, qd: np.ndarray, obs: np.ndarray, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The task's reward and termination for transitions ending in these rows (`action`: the
        actions that led to them)."""
        physics, task = self.physics(q, qd, obs), self.task
        held = task.command  # the task's own envs' commands: put back after these rows' are used
        if self._command is not None:
            task.command = torch.from_numpy(obs[:, self._command].astype(np.float32)).to(task.device)
        try:
            return task.reward(physics, action), task.terminated(physics)
        finally:
            task.command = held
