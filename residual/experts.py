"""Scripted experts: demonstrations without downloaded data or a trained policy.

Each expert maps a batch of observations to actions in [-1, 1] for one task, closed loop, and keeps
only per-env tensors of state (a phase, a timer), so it runs on any number of envs at once.

- `panda_reach`, `panda_push`: Cartesian waypoints for the end effector (the pusher for push),
  turned into joint position targets by damped-least-squares IK on the arm's own MuJoCo model
  every tick. The Jacobian needs MuJoCo's kinematics per env (a loop over envs on the CPU): these are
  data generators, never part of a training loop.
- `robosuite:Lift`: OSC_POSE waypoints (above the cube, down, close, lift), read from robosuite's
  object state; no kinematics needed.

Their success rates are measured by `q2real demos record` (printed and stored in the dataset).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import mujoco
import numpy as np
import torch

from q2real.configs.loader import ConfigError
from q2real.sim import VecEnv
from q2real.sim.env import TaskEnv


class Expert(ABC):
    def __init__(self, env: VecEnv):
        self.env = env

    @abstractmethod
    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions (num_envs, action_dim) in [-1, 1] for the current observations."""

    def reset(self, done: torch.Tensor) -> None:  # noqa: B027 - stateless experts keep nothing to forget
        """Forget the per-env state of envs whose episode just ended."""


class ArmWaypointExpert(Expert):
    """Drives an arm's end-effector site toward a Cartesian waypoint with one damped-least-squares IK
    step per tick; subclasses choose the waypoint from the observation."""

    site: str = "end_effector"
    max_step: float = 1.0
    """m: how far ahead of the site the commanded waypoint may lie."""
    damping: float = 0.05
    iterations: int = 8

    def __init__(self, env: VecEnv):
        super().__init__(env)
        if not isinstance(env, TaskEnv):
            raise ConfigError(f"{type(self).__name__}: needs a q2real task env, got {type(env).__name__}")
        task = env.task
        self.model = task.model
        self.data = mujoco.MjData(self.model)
        self.site_id = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, self.site)
        self.qpos_index = task.qpos_index.cpu().numpy()
        self.dof_index = task.qvel_index.cpu().numpy()
        self.scale = task.command_scale.cpu().numpy()
        self.offset = task.command_offset.cpu().numpy()
        # IK searches only the joint positions an action can command, so the other joints make up for one
        # that its action range stops, instead of the final clip leaving the site short of the waypoint.
        self.low = np.maximum(task.joint_low.cpu().numpy(), self.offset - self.scale)
        self.high = np.minimum(task.joint_high.cpu().numpy(), self.offset + self.scale)
        self.joints = len(self.qpos_index)

    @abstractmethod
    def waypoint(self, obs: np.ndarray, site: np.ndarray) -> np.ndarray:
        """(N, 3) where the site should go next, from observations and the site's position."""

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.detach().cpu().numpy().astype(np.float64)
        q = x[:, : self.joints]
        site, _ = self._kinematics(q)
        goal = self.waypoint(x, site)
        error = goal - site
        norm = np.linalg.norm(error, axis=1, keepdims=True)
        goal = site + error * np.minimum(1.0, self.max_step / np.maximum(norm, 1e-9))
        # Command the joint configuration that puts the site at the goal (DLS iterated from the current
        # joints), not one small step toward it: a target of "where I am plus a little" is what a
        # cloned policy reproduces worst (its error is as large as the step).
        target = q
        for _ in range(self.iterations):
            site, jac = self._kinematics(target)
            jjt = jac @ jac.transpose(0, 2, 1) + self.damping**2 * np.eye(3)
            dq = (jac.transpose(0, 2, 1) @ np.linalg.solve(jjt, (goal - site)[..., None]))[..., 0]
            target = np.clip(target + dq, self.low, self.high)
        action = np.clip((target - self.offset) / self.scale, -1.0, 1.0)
        return torch.as_tensor(action, dtype=torch.float32, device=obs.device)

    def _kinematics(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Site positions (N, 3) and translational Jacobians (N, 3, joints) at joint positions q."""
        model, data = self.model, self.data
        site = np.zeros((len(q), 3))
        jac = np.zeros((len(q), 3, self.joints))
        full = np.zeros((3, model.nv))
        for i in range(len(q)):
            data.qpos[self.qpos_index] = q[i]
            mujoco.mj_kinematics(model, data)
            mujoco.mj_comPos(model, data)
            mujoco.mj_jacSite(model, data, full, None, self.site_id)
            site[i] = data.site_xpos[self.site_id]
            jac[i] = full[:, self.dof_index]
        return site, jac


class ReachExpert(ArmWaypointExpert):
    """Straight to the target (observation terms: joints 7, velocities 7, target 3)."""

    def waypoint(self, obs: np.ndarray, site: np.ndarray) -> np.ndarray:
        return obs[:, 14:17]


class PushExpert(ArmWaypointExpert):
    """Goes around the cube at a safe height to a point behind it on the line from the target, comes
    down, and pushes along that line; re-plans every tick, so a cube that slides sideways is chased.
    Observation terms: joints 7, velocities 7, pusher 3, cube 3, target 2."""

    site = "pusher"
    max_step = 0.04
    """Faster than reaching: an episode is 4 s (measured on 64 episodes: 0.02 m succeeds 58 %, 0.04 m 64 %)."""
    behind = 0.06
    """m from the cube's centre to the pre-push point (half cube 2.5 cm + pusher 2 cm + margin)."""
    height = 0.02
    """m: pusher centre height while pushing (just below the cube's centre)."""
    safe = 0.10
    """m: height for moving around the cube."""
    lateral = 0.025
    """m: how far off the push line the pusher may be and still push. The arm lags its targets by a few
    cm while it comes down (joint-impedance gains, effort-limited leads); 1.5 cm sent it back up to
    re-approach in a loop (59 % success on 256 episodes, against 62 %)."""
    near = 0.015
    """m: how close above the pre-push point the pusher must be before it comes down."""

    def waypoint(self, obs: np.ndarray, site: np.ndarray) -> np.ndarray:
        cube, target = obs[:, 17:19], obs[:, 20:22]
        to_target = target - cube
        distance = np.linalg.norm(to_target, axis=1, keepdims=True)
        u = to_target / np.maximum(distance, 1e-9)
        rel = site[:, :2] - cube
        along = (rel * u).sum(1)
        lateral = np.linalg.norm(rel - along[:, None] * u, axis=1)
        pre = cube - self.behind * u
        aligned = (along < -0.03) & (along > -0.09) & (lateral < self.lateral) & (site[:, 2] < 0.05)
        near_pre = np.linalg.norm(site[:, :2] - pre, axis=1) < self.near
        close = np.linalg.norm(rel, axis=1) < 0.09
        waypoint = np.empty_like(site)
        # Pushing: aim through the cube along the line to the target; stop once the cube is there.
        push = np.c_[cube + np.minimum(distance, 0.03) * u, np.full(len(site), self.height)]
        hold = np.c_[pre, np.full(len(site), self.height)]
        descend = hold
        around = np.c_[pre, np.full(len(site), self.safe)]
        lift = np.c_[site[:, :2], np.full(len(site), self.safe)]
        waypoint[:] = around
        waypoint[close & (site[:, 2] < 0.07) & ~aligned & ~near_pre] = lift[
            close & (site[:, 2] < 0.07) & ~aligned & ~near_pre
        ]
        waypoint[near_pre & ~aligned] = descend[near_pre & ~aligned]
        waypoint[aligned] = push[aligned]
        arrived = distance[:, 0] < 0.01
        waypoint[aligned & arrived] = hold[aligned & arrived]
        return waypoint


class LiftExpert(Expert):
    """robosuite Lift with OSC_POSE: above the cube, down to it, close the gripper, lift. The object
    state's last three numbers are the vector from the gripper to the cube, its first three the cube's position."""

    gain = 10.0
    """OSC_POSE takes deltas of up to 5 cm per unit action: an error of 10 cm is a full-scale action."""

    def __init__(self, env: VecEnv):
        super().__init__(env)
        self.phase = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
        self.timer = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        cube = obs[:, -10:-7]
        to_cube = obs[:, -3:]  # gripper_to_cube_pos: cube - eef in robosuite 1.5 (measured)
        above = to_cube + torch.tensor([0.0, 0.0, 0.08], device=obs.device)
        grasp = to_cube + torch.tensor([0.0, 0.0, -0.005], device=obs.device)
        phase = self.phase
        error = torch.where((phase == 0)[:, None], above, grasp)
        error = torch.where((phase >= 2)[:, None], torch.zeros_like(grasp), error)
        lift = torch.zeros_like(cube)
        lift[:, 2] = 1.0
        move = torch.where((phase == 3)[:, None], lift, (self.gain * error).clamp(-1, 1))
        gripper = torch.where(phase >= 2, 1.0, -1.0)
        action = torch.zeros(len(obs), self.env.action_dim, device=obs.device)
        action[:, :3] = move
        action[:, -1] = gripper
        # Phase changes: aligned above -> descend; at the cube -> close (8 ticks) -> lift.
        self.timer += 1
        next_phase = phase.clone()
        next_phase[(phase == 0) & (above.norm(dim=1) < 0.01)] = 1
        next_phase[(phase == 1) & (grasp.norm(dim=1) < 0.008)] = 2
        next_phase[(phase == 2) & (self.timer > 8)] = 3
        self.timer = torch.where(next_phase != phase, 0, self.timer)
        self.phase = next_phase
        return action

    def reset(self, done: torch.Tensor) -> None:
        self.phase = torch.where(done, 0, self.phase)
        self.timer = torch.where(done, 0, self.timer)


EXPERTS: dict[str, type[Expert]] = {
    "panda_reach": ReachExpert,
    "panda_push": PushExpert,
    "robosuite:Lift": LiftExpert,
}


def make_expert(task: str, env: VecEnv) -> Expert:
    if task not in EXPERTS:
        raise ConfigError(f"expert: no scripted expert for task {task!r}; there are {sorted(EXPERTS)}")
    return EXPERTS[task](env)
