"""Films of a policy on its robot: which offscreen GL renders, what is written on a frame, which camera
follows which robot, and what an evaluation's film records."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from q2real.agents.callbacks import evaluate_episodes
from q2real.configs.errors import MissingDependency
from q2real.configs.loader import ConfigError
from q2real.hardware import robot_spec
from q2real.hardware.model import load_model
from q2real.sim import make
from q2real.sim.filming import HOLD_SECONDS, EpisodeFilm, check_filming, moving_base, robot_root, task_lines
from q2real.sim.offscreen import choose_backend
from q2real.sim.overlay import overlay_text


def test_the_users_mujoco_gl_is_taken_without_trying_any() -> None:
    def refuse(backend: str) -> bool:
        raise AssertionError(f"tried {backend}")

    assert choose_backend("OSMesa ", refuse) == "osmesa"


def test_egl_is_tried_first_then_osmesa() -> None:
    tried: list[str] = []

    def works(backend: str) -> bool:
        tried.append(backend)
        return backend == "osmesa"

    assert choose_backend(None, works) == "osmesa"
    assert tried == ["egl", "osmesa"]
    assert choose_backend("", lambda backend: True) == "egl"


def test_no_offscreen_gl_names_what_to_install() -> None:
    with pytest.raises(MissingDependency, match=r"apt-get install libegl1 .*libosmesa6.*MUJOCO_GL"):
        choose_backend(None, lambda backend: False)


def test_overlay_writes_its_lines_top_left_and_leaves_the_rest() -> None:
    frame = np.full((240, 320, 3), 90, dtype=np.uint8)
    assert overlay_text(frame, []) is frame
    written = overlay_text(frame, ["command  vx +0.50  vy +0.00  wz +0.20", "t  1.0 s   return 12.3"])
    assert written.shape == frame.shape and written.dtype == np.uint8
    assert (written[:40, :200] != 90).any(), "no text in the top-left corner"
    assert (written[120:, :] == 90).all(), "the lower half of the frame changed"
    assert (frame == 90).all(), "the frame passed in was drawn on"


def test_a_floating_or_planar_base_is_followed_an_arm_or_a_cart_is_not() -> None:
    def follows(robot: str) -> bool:
        model = load_model(robot_spec(robot))
        return moving_base(model, robot_root(model))

    assert follows("spot") and follows("hopper")
    assert not follows("panda") and not follows("cartpole")


def test_the_figures_written_are_the_tasks_own() -> None:
    spot = make(task="spot_joystick", num_envs=2, backend="mujoco", device="cpu")
    try:
        spot.reset(seed=0)
        spot.task.command[:] = torch.tensor([0.5, -0.25, 0.2])
        lines = task_lines(spot.task, spot.physics)
    finally:
        spot.close()
    assert len(lines) == 2
    assert lines[0][0] == "command  vx +0.50  vy -0.25  wz +0.20"
    assert lines[0][1].startswith("measured vx +0.00  vy +0.00  wz +0.00"), lines[0][1]
    push = make(task="panda_push", num_envs=1, backend="mujoco", device="cpu")
    try:
        push.reset(seed=0)
        cube = push.task.cube_position(push.physics)[0, :2]
        push.task.command[:] = cube + torch.tensor([0.03, 0.04])
        assert task_lines(push.task, push.physics) == [["cube to target 5.0 cm"]]
    finally:
        push.close()


def test_an_adapter_task_is_refused_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match="log.video: films q2real's own tasks.*'gymnasium:Pendulum-v1'"):
        check_filming("gymnasium:Pendulum-v1")


def test_a_film_records_the_first_seconds_of_each_episode_then_holds_the_end() -> None:
    env = make(task="pendulum_swingup", num_envs=3, backend="mujoco", device="cpu", task_params={"episode_length": 40})
    film = EpisodeFilm("pendulum", envs=2, seconds=0.5, fps=25.0)
    try:
        evaluate_episodes(lambda obs: torch.zeros(3, 1), env, seed=1, watch=film)
    finally:
        env.close()
    assert film.fps == 25.0  # 50 Hz control, every second step
    assert len(film.shots) == 2  # the films of envs 0 and 1, not 2
    assert [len(shots) for shots in film.shots] == [12, 12]  # 0.5 s at 25 fps, the last step on 0.48 s
    assert film.shots[0][0].lines[0] == "pendulum" and film.shots[0][-1].lines[-1].startswith("t  0.5 s   return")
    whole = EpisodeFilm("", envs=1, fps=25.0)
    env = make(task="pendulum_swingup", num_envs=1, backend="mujoco", device="cpu", task_params={"episode_length": 40})
    try:
        evaluate_episodes(lambda obs: torch.zeros(1, 1), env, seed=1, watch=whole)
    finally:
        env.close()
    held = round(HOLD_SECONDS * 25.0)
    assert len(whole.shots[0]) == 19 + held  # steps 2, 4, ..., 38 (the 40th is the next episode's start)
    assert whole.shots[0][-1].lines[-1].startswith("episode over: return")
    assert math.isclose(float(whole.shots[0][-1].qpos[0]), float(whole.shots[0][-held - 1].qpos[0]))


def test_a_film_of_one_env_of_a_batch_writes_that_envs_figures() -> None:
    env = make(task="spot_joystick", num_envs=3, backend="mujoco", device="cpu", task_params={"episode_length": 6})
    film = EpisodeFilm("spot", envs=1, fps=25.0)
    try:
        evaluate_episodes(lambda obs: torch.zeros(3, 12), env, seed=2, watch=film)
    finally:
        env.close()
    assert len(film.shots) == 1
    first = film.shots[0][0].lines
    assert first[0] == "spot" and first[1].startswith("command  vx") and first[2].startswith("measured vx"), first


def test_a_residual_learners_env_is_filmed_through_its_wrapper() -> None:
    from torch import nn

    from q2real.residual.base_env import BaseActionEnv

    inner = make(task="pendulum_swingup", num_envs=1, backend="mujoco", device="cpu", task_params={"episode_length": 8})
    env = BaseActionEnv(inner, nn.Linear(inner.obs_dim, 1), 1)
    film = EpisodeFilm(envs=1, fps=25.0)
    try:
        evaluate_episodes(lambda obs: torch.zeros(1, 1), env, seed=0, watch=film)
    finally:
        env.close()
    assert len(film.shots[0]) == 3 + round(HOLD_SECONDS * 25.0)  # steps 2, 4, 6, then the held end


def test_rendering_after_another_opengl_platform_was_set_up_is_refused_naming_the_fix() -> None:
    """PyOpenGL binds one platform per process (robosuite's import binds GLX): a frame rendered after that
    used to die in gladLoadGL; it is refused with what to do instead."""
    import subprocess
    import sys

    script = (
        "import os; os.environ.pop('MUJOCO_GL', None); os.environ.pop('PYOPENGL_PLATFORM', None)\n"
        "import OpenGL.platform\n"
        "from q2real.sim import offscreen\n"
        "offscreen.backend_works = lambda backend: backend == 'egl'\n"
        "try:\n    offscreen.use_offscreen_gl()\nexcept Exception as err:\n    print(err)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert "rendering: OpenGL was already set up for GLXPlatform in this process" in out.stdout, out.stderr[-2000:]
    assert "start the process with MUJOCO_GL=egl" in out.stdout
