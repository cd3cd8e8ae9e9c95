"""MuJoCo's offscreen GL without a display: which backend renders here, and making it the one MuJoCo uses.

MuJoCo picks its GL context class once, from `MUJOCO_GL`, when `mujoco` is first imported (a desktop's
GLFW window when unset). A trainer or the sim robot imports MuJoCo long before it renders a frame, so
the headless choice is made at the first render instead: the user's `MUJOCO_GL` where it is set, else
EGL (the GPU's, or Mesa's software EGL on a machine without one), else OSMesa. Each candidate is tried
in a child process: one that fails to load leaves PyOpenGL set up for it in the process that tried.
"""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from q2real.configs.errors import MissingDependency

BACKENDS = ("egl", "osmesa")
"""Headless backends, in the order they are tried."""
PACKAGES = "libegl1 libopengl0 libegl-mesa0 libgl1-mesa-dri"
"""The Debian/Ubuntu packages that give EGL (Mesa's software renderer where there is no GPU)."""
OSMESA_PACKAGE = "libosmesa6"
_PROBE = "import mujoco; context = mujoco.GLContext(8, 8); context.make_current(); context.free()"


def choose_backend(user: str | None, works: Callable[[str], bool]) -> str:
    """The backend to render with: `user`'s (`MUJOCO_GL`) where set, else the first of `BACKENDS` that
    `works`; none working is an error that says what to install."""
    if user and user.strip():
        return user.strip().lower()
    for backend in BACKENDS:
        if works(backend):
            return backend
    raise MissingDependency(
        f"rendering: no offscreen OpenGL here (MUJOCO_GL unset; tried {', '.join(BACKENDS)}); install EGL: "
        f"apt-get install {PACKAGES} (or {OSMESA_PACKAGE} for OSMesa), or set MUJOCO_GL to a backend that works"
    )


def backend_works(backend: str) -> bool:
    """Whether MuJoCo can make a GL context with `backend`, tried in a child process."""
    env = {**os.environ, "MUJOCO_GL": backend}
    env.pop("PYOPENGL_PLATFORM", None)  # MuJoCo sets it to match the backend, and refuses any other
    try:
        result = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


@functools.cache
def use_offscreen_gl() -> str:
    """Choose the backend (once per process) and make it the one `mujoco.Renderer` opens; returns its
    name. Children started afterwards (the sim robot) inherit it through `MUJOCO_GL`."""
    user = os.environ.get("MUJOCO_GL")
    backend = choose_backend(user, backend_works)
    if user and user.strip():
        return backend  # MuJoCo read it at import
    set_up = sys.modules.get("OpenGL.platform")
    platform = type(getattr(set_up, "PLATFORM", None)).__name__
    if set_up is not None and not platform.lower().startswith(backend):
        # PyOpenGL binds its platform once per process; a context of another one fails in gladLoadGL.
        raise MissingDependency(
            f"rendering: OpenGL was already set up for {platform} in this process (something imported it before "
            f"the first frame, as robosuite does); start the process with MUJOCO_GL={backend}"
        )
    os.environ["MUJOCO_GL"] = backend
    gl_context: Any = importlib.import_module("mujoco.rendering.classic.gl_context")
    chosen = importlib.import_module(f"mujoco.{backend}").GLContext
    if getattr(gl_context, "GLContext", None) is not chosen:
        gl_context.GLContext = chosen  # imported before the choice: `Renderer` looks the class up here
    return backend
