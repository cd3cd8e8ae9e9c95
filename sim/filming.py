"""Frames of a simulated robot: a camera that suits it, the task's target drawn in, its figures written on.

What a frame needs (a `Shot`: one env's joint positions, target and lines of text) is recorded while an
evaluation runs, and rendered afterwards (`EpisodeFilm`): the rollout pays a copy of a few numbers per
frame, never a render, and one batched evaluation films any of its envs. A robot whose base moves (a
free joint, or a planar runner's slides) is followed by a tracking camera; one fixed to the world (an
arm, a pendulum) gets one view that holds everything the film shows it do.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mujoco import (
    MjData,
    MjModel,
    MjvCamera,
    MjvScene,
    Renderer,
    mj_forward,
    mj_kinematics,
    mjtCamera,
    mjtGeom,
    mjtJoint,
    mjv_defaultFreeCamera,
    mjv_initGeom,
)

from q2real.configs.loader import ConfigError
from q2real.sim.offscreen import use_offscreen_gl
from q2real.sim.overlay import overlay_text
from q2real.sim.physics import PhysicsState
from q2real.sim.task import Task
from q2real.sim.tasks.arm_push import ArmPush
from q2real.sim.tasks.arm_reach import ArmReach
from q2real.sim.tasks.floating_base import FloatingBaseTask
from q2real.sim.vec_env import StepResult, VecEnv
from q2real.sim.video import GifWriter, VideoWriter, check_size, video_module

FPS = 25.0
"""Frames per second a film aims at (the nearest rate a whole number of control steps gives)."""
HOLD_SECONDS = 0.6
"""How long a film holds an episode's last frame, with its outcome written on it."""
TARGET_RGBA = (0.1, 0.8, 0.2, 0.5)
VIDEO_SIZE = (320, 240)
"""Width and height (px) of a film unless asked otherwise, as a training run's evaluations are filmed:
about 50 ms a frame with Mesa's software EGL, so a film of `VIDEO_SECONDS` costs an evaluation about
12 s more on a CPU."""
VIDEO_SECONDS = 10.0
"""Seconds of an evaluation episode a training run films."""


def check_rendering() -> None:
    """Refuse to start work that ends in a video where there is no video encoder or no offscreen GL."""
    video_module()
    use_offscreen_gl()


def check_filming(task: str, what: str = "log.video") -> None:
    """`check_rendering`, and refuse an adapter's task: q2real films its own tasks' MuJoCo models."""
    if ":" in task:
        raise ConfigError(f"{what}: films q2real's own tasks (their MuJoCo model), not the adapter task {task!r}")
    check_rendering()


@dataclass(frozen=True)
class Shot:
    """What one frame shows: the model's joint positions, a point to mark (a target, world frame) and text."""

    qpos: np.ndarray
    lines: tuple[str, ...]
    target: np.ndarray | None = None
    target_radius: float = 0.03


def moving_base(model: MjModel, body: int) -> bool:
    """Whether `body` (a robot's root) translates in more than one direction: a free joint, or the slides
    of a planar runner; a cart on its rail does not."""
    joints = range(model.body_jntadr[body], model.body_jntadr[body] + model.body_jntnum[body])
    kinds = [model.jnt_type[j] for j in joints] if model.body_jntadr[body] >= 0 else []
    return mjtJoint.mjJNT_FREE in kinds or kinds.count(mjtJoint.mjJNT_SLIDE) >= 2


def robot_root(model: MjModel, joint: int = 0) -> int:
    """The root body (a child of the world) that carries `joint` (default: the model's first)."""
    return int(model.body_rootid[model.jnt_bodyid[joint]])


def frame_camera(model: MjModel, data: MjData, poses: Sequence[np.ndarray], follow: int | None = None) -> MjvCamera:
    """A three-quarter view that holds every geom but the floor in each of `poses` (qpos vectors; `data`
    is scratch); with `follow` (a body), a tracking camera that keeps that body in the middle at the
    distance that holds the first pose."""
    solid = [g for g in range(model.ngeom) if model.geom_type[g] != mjtGeom.mjGEOM_PLANE]
    radius = model.geom_rbound[solid][:, None]
    low, high = np.full(3, np.inf), np.full(3, -np.inf)
    for qpos in poses[:1] if follow is not None else poses:
        data.qpos[:] = qpos
        mj_kinematics(model, data)
        low = np.minimum(low, (data.geom_xpos[solid] - radius).min(axis=0))
        high = np.maximum(high, (data.geom_xpos[solid] + radius).max(axis=0))
    camera = MjvCamera()
    mjv_defaultFreeCamera(model, camera)
    camera.lookat[:] = (low + high) / 2
    half_fov = math.radians(model.vis.global_.fovy) / 2
    camera.distance = 1.1 * float(np.linalg.norm(high - low)) / 2 / math.sin(half_fov)
    camera.azimuth, camera.elevation = 135.0, -20.0
    if follow is not None:
        camera.type = mjtCamera.mjCAMERA_TRACKING
        camera.trackbodyid = follow
    return camera


class Filmer:
    """Renders `Shot`s of one model offscreen (`mujoco.Renderer`) with the camera `frame_camera` fits to
    `poses` (default: the first shot's). Create, use and close it in one thread: its GL context is
    current there."""

    def __init__(self, model: MjModel, width: int, height: int, poses: Sequence[np.ndarray] = ()):
        use_offscreen_gl()
        check_size(width, height)
        self.model = model = copy.copy(model)  # the offscreen buffer is a model setting: the caller's stays
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, height)
        self.data = MjData(model)
        self.renderer = Renderer(model, height, width)
        self.root = robot_root(model)
        self.poses = list(poses)
        self.camera: MjvCamera | None = None

    def render(self, shot: Shot) -> np.ndarray:
        """The frame (height, width, 3, uint8) of `shot`."""
        model, data = self.model, self.data
        if self.camera is None:
            follow = self.root if moving_base(model, self.root) else None
            self.camera = frame_camera(model, data, self.poses or [shot.qpos], follow)
        data.qpos[:] = shot.qpos
        mj_forward(model, data)
        self.renderer.update_scene(data, self.camera)
        if shot.target is not None:
            mark(self.renderer.scene, shot.target, shot.target_radius)
        return overlay_text(self.renderer.render(), shot.lines)

    def close(self) -> None:
        self.renderer.close()


def mark(scene: MjvScene, point: np.ndarray, radius: float) -> None:
    """A translucent green sphere at `point` (world frame), drawn in the scene only."""
    if scene.ngeom >= scene.maxgeom:
        return
    mjv_initGeom(
        scene.geoms[scene.ngeom],
        mjtGeom.mjGEOM_SPHERE,
        np.array([radius, 0.0, 0.0]),
        np.asarray(point, dtype=np.float64),
        np.eye(3).flatten(),
        np.array(TARGET_RGBA, dtype=np.float32),
    )
    scene.ngeom += 1


def task_lines(task: Task, physics: PhysicsState) -> list[list[str]]:
    """Per env, the task's figures worth watching: a legged robot's commanded and measured base
    velocity, a standing one's base height, an arm's distance to its target."""
    rows = physics.qpos.shape[0]
    if isinstance(task, FloatingBaseTask) and task.command_dim >= 3:
        command = task.command[:, :3].tolist()
        v, w = task.base_linear_velocity(physics).tolist(), task.base_angular_velocity(physics).tolist()
        return [
            [
                f"command  vx {c[0]:+.2f}  vy {c[1]:+.2f}  wz {c[2]:+.2f}",
                f"measured vx {vi[0]:+.2f}  vy {vi[1]:+.2f}  wz {wi[2]:+.2f}",
            ]
            for c, vi, wi in zip(command, v, w, strict=True)
        ]
    if isinstance(task, FloatingBaseTask):
        heights = task.base_height(physics).tolist()
        return [[f"base height {h:.2f} m (standing {task.height:.2f} m)"] for h in heights]
    if isinstance(task, ArmPush):
        distance = (task.cube_position(physics)[:, :2] - task.command).norm(dim=-1).tolist()
        return [[f"cube to target {d * 100:.1f} cm"] for d in distance]
    if isinstance(task, ArmReach):
        return [[f"hand to target {d * 100:.1f} cm"] for d in task.distance(physics).tolist()]
    return [[] for _ in range(rows)]


def task_targets(task: Task) -> tuple[np.ndarray | None, float]:
    """Each env's target in the world frame (num_envs, 3) for the tasks that have one, and its drawn
    radius (the success radius); the arms stand at the world's origin, so base frame = world frame."""
    if isinstance(task, ArmReach | ArmPush):
        command = task.command.detach().cpu().numpy()
        if command.shape[1] == 2:  # a point on the floor
            command = np.concatenate([command, np.zeros((len(command), 1))], axis=1)
        return command, float(task.config.success_radius)
    return None, 0.0


class EpisodeFilm:
    """The first episode of each of the first `envs` envs of an evaluation, at most `seconds` of it,
    recorded as `Shot`s at about `fps`: pass it as `watch` to `evaluate_episodes`, then `write` the film.
    Episodes follow each other in the film, env by env."""

    def __init__(self, title: str = "", envs: int = 1, seconds: float = math.inf, fps: float = FPS):
        if envs < 1:
            raise ConfigError(f"--episodes: expected >= 1, got {envs}")
        if not seconds > 0:
            raise ConfigError(f"--seconds: expected > 0, got {seconds}")
        if not 0 < fps <= 120:
            raise ConfigError(f"--fps: expected a rate in (0, 120], got {fps}")
        self.title, self.envs, self.seconds, self.wanted_fps = title, envs, seconds, fps
        self.shots: list[list[Shot]] = []
        self.model: MjModel | None = None
        self.fps = fps
        self._stride, self._steps, self._period = 1, 0, 0.0
        self._returns = np.zeros(0)
        self._success: np.ndarray | None = None
        self._over = np.zeros(0, dtype=bool)

    def _start(self, env: VecEnv) -> None:
        task, physics = getattr(env, "task", None), getattr(env, "physics", None)
        if not isinstance(task, Task) or physics is None or env.control_period is None:
            name = getattr(getattr(env, "config", None), "task", type(env).__name__)
            raise ConfigError(f"video: films q2real's own tasks (their MuJoCo model); {name!r} is not one")
        self.model = task.model
        self._period = env.control_period
        self._stride = max(1, round(1.0 / (self.wanted_fps * self._period)))
        self.fps = 1.0 / (self._stride * self._period)
        self.envs = min(self.envs, env.num_envs)
        self.shots = [[] for _ in range(self.envs)]
        self._returns = np.zeros(self.envs)
        self._over = np.zeros(self.envs, dtype=bool)

    def __call__(self, env: VecEnv, result: StepResult) -> None:
        """After each evaluation step: add up each filmed env's return and record its frame when due."""
        while not hasattr(env, "task") and isinstance(getattr(env, "env", None), VecEnv):
            env = env.env  # pyright: ignore[reportAttributeAccessIssue]  # a wrapper's (a residual's base action)
        if self.model is None:
            self._start(env)
        task: Task = env.task  # pyright: ignore[reportAttributeAccessIssue]
        self._steps += 1
        n = self.envs
        self._returns += np.where(self._over, 0.0, result.reward[:n].detach().cpu().numpy())
        flag = result.info.get("success")
        if flag is not None:
            now = flag[:n].detach().cpu().numpy().astype(bool) & ~self._over  # not the next episode's
            self._success = now if self._success is None else self._success | now
        seconds = self._steps * self._period
        done = result.done[:n].detach().cpu().numpy()
        for row in np.flatnonzero(done & ~self._over):
            self._hold(int(row))
        # Past `seconds` a film is over: its last frame is not the episode's end, so it holds no outcome.
        self._over |= done | (seconds > self.seconds + 1e-9)
        if self._over.all() or self._steps % self._stride:
            return
        physics = env.physics  # pyright: ignore[reportAttributeAccessIssue]
        qpos = physics.qpos[:n].detach().cpu().double().numpy()
        lines = task_lines(task, physics)
        targets, radius = task_targets(task)
        for row in map(int, np.flatnonzero(~self._over)):
            text = (self.title, *lines[row], self._progress(row, seconds))
            target = None if targets is None else targets[row]
            self.shots[row].append(Shot(qpos[row], tuple(t for t in text if t), target, radius))

    def _progress(self, row: int, seconds: float) -> str:
        line = f"t {seconds:4.1f} s   return {self._returns[row]:.1f}"
        if self._success is not None:
            line += f"   success {'yes' if self._success[row] else 'no'}"
        return line

    def _hold(self, row: int) -> None:
        """The episode of `row` ended: its last frame again, for `HOLD_SECONDS`, with its outcome."""
        if not self.shots[row]:
            return
        last = self.shots[row][-1]
        outcome = f"episode over: return {self._returns[row]:.1f}"
        if self._success is not None:
            outcome += f", {'succeeded' if self._success[row] else 'failed'}"
        held = Shot(last.qpos, (*last.lines[:-1], outcome), last.target, last.target_radius)
        self.shots[row] += [held] * max(1, round(HOLD_SECONDS * self.fps))

    @property
    def frames(self) -> int:
        return sum(len(shots) for shots in self.shots)

    def write(
        self,
        path: str | Path,
        width: int = VIDEO_SIZE[0],
        height: int = VIDEO_SIZE[1],
        gif: str | Path | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> VideoWriter:
        """Render every recorded shot to an MP4 at `path` (and a small GIF at `gif`); `progress(done, total)`
        after each frame. Returns the closed writer (its `frames`, `fps`)."""
        if self.model is None or not self.frames:
            raise ConfigError(f"{path}: nothing was filmed (no evaluation step ran)")
        check_size(width, height)
        poses = [shot.qpos for shots in self.shots for shot in shots[:: max(1, len(shots) // 12)]]
        filmer = Filmer(self.model, width, height, poses)
        gif_writer = GifWriter(gif, self.fps) if gif is not None else None
        total, done = self.frames, 0
        try:
            with VideoWriter(path, width, height, self.fps) as video:
                for shots in self.shots:
                    for frame in render_shots(filmer, shots):
                        video.write(frame)
                        if gif_writer is not None:
                            gif_writer.add(frame)
                        done += 1
                        if progress is not None:
                            progress(done, total)
        finally:
            filmer.close()
        if gif_writer is not None:
            gif_writer.close()
        return video


def render_shots(filmer: Filmer, shots: Sequence[Shot]) -> Iterator[np.ndarray]:
    """Frames of `shots`, a shot repeated (an episode's held end) rendered once."""
    frame, previous = np.zeros(0, dtype=np.uint8), None
    for shot in shots:
        if shot is not previous:
            frame, previous = filmer.render(shot), shot
        yield frame
