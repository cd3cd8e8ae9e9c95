"""How a floating base really moved on the sim robot: the simulator's truth, printed on the console for
the operator and labelled so, because the node cannot measure it (it has no state estimator).

Every control step after the first command: the base's velocity in its own frame (forward, lateral),
its yaw rate and height, and the distance it travelled on the floor; every `every` seconds a line with
the means since the last one, beside the velocity command the sim robot publishes (if any), and at
the end one line for the whole run.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import mujoco
import numpy as np


def base_velocity(model: mujoco.MjModel, data: mujoco.MjData, joint: int) -> np.ndarray:
    """A free joint's twist in its body's frame: linear (MuJoCo's is in the world frame) then angular."""
    q, v = int(model.jnt_qposadr[joint]), int(model.jnt_dofadr[joint])
    frame = np.zeros(9)
    mujoco.mju_quat2Mat(frame, data.qpos[q + 3 : q + 7])
    return np.concatenate([frame.reshape(3, 3).T @ data.qvel[v : v + 3], data.qvel[v + 3 : v + 6]])


class GroundTruth:
    """The base's motion, summed between lines and over the run."""

    def __init__(self, model: mujoco.MjModel, data: mujoco.MjData, base: int, every: float = 5.0):
        self.model, self.data, self.base, self.every = model, data, base, every
        self._q = int(model.jnt_qposadr[base])
        self._last_xy: np.ndarray | None = None
        self.travelled = 0.0
        self.run = np.zeros(5)
        """Sums over the run of forward, lateral, yaw rate, height, and the step count."""
        self.window = np.zeros(5)
        self.command = np.zeros(3)
        self.command_sum = np.zeros(3)
        self.height_min = math.inf
        self.start: float | None = None
        self._next_line = math.inf

    def step(self, sim_time: float, command: list[float] | None, out: Callable[[str], None] = print) -> None:
        """One control step: `command` is the velocity command published now (None: none)."""
        qpos, q = self.data.qpos, self._q
        forward, lateral, _, _, _, yaw_rate = base_velocity(self.model, self.data, self.base)
        xy = qpos[q : q + 2].copy()
        if self.start is None:
            self.start, self._next_line = sim_time, sim_time + self.every
        elif self._last_xy is not None:
            self.travelled += float(np.linalg.norm(xy - self._last_xy))
        self._last_xy = xy
        height = float(qpos[q + 2])
        self.height_min = min(self.height_min, height)
        sample = np.array([forward, lateral, yaw_rate, height, 1.0])
        self.run += sample
        self.window += sample
        self.command = np.asarray(command if command is not None else [math.nan] * 3, dtype=float)
        self.command_sum += self.command
        if sim_time >= self._next_line:
            self._next_line += self.every
            out(f"sim robot (ground truth): {self._means(self.window, self.command)}, travelled {self.travelled:.1f} m")
            self.window[:] = 0.0

    def _means(self, sums: np.ndarray, command: np.ndarray) -> str:
        forward, lateral, yaw, height = sums[:4] / max(sums[4], 1.0)
        said = not np.isnan(command).any()
        cmd = (lambda i: f" (cmd {command[i]:.2f})") if said else (lambda i: "")
        return (
            f"forward {forward:.2f} m/s{cmd(0)}, lateral {lateral:.2f} m/s{cmd(1)}, yaw rate {yaw:.2f} rad/s{cmd(2)}, "
            f"height {height:.2f} m"
        )

    def summary(self, sim_time: float) -> str:
        """The whole run in one line ('' before the first command)."""
        if self.start is None:
            return ""
        command = self.command_sum / max(self.run[4], 1.0)
        return (
            f"sim robot (ground truth): travelled {self.travelled:.1f} m in {sim_time - self.start:.1f} s; means "
            f"{self._means(self.run, command)}; lowest height {self.height_min:.2f} m"
        )
