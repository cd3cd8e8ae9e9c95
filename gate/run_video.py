"""The sim robot's run on video (`q2real deploy --sim --record-video`, `q2real-sim-robot --record-video`).

The real-time physics loop never waits on a render: once every frame period it hands over a copy of its
joint positions and a caption (microseconds), and a thread of its own renders the newest copy offscreen
and encodes it. A frame whose time came while the one before was still rendering repeats that one, so
the video keeps the run's own clock; how many did is said at the end.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import mujoco
import numpy as np

from q2real.sim.filming import FPS, Filmer, Shot
from q2real.sim.video import VideoWriter

VIDEO_SIZE = (320, 240)
"""Width and height (px) of the sim robot's video."""
RENDER_NICE = 10
"""The render thread's nice value: where the cores are few, the physics loop gets them first."""
STARTUP = 30.0
"""Seconds the render thread may take to open its GL context and the file before the robot gives up."""


class RunVideo:
    """Films a model as the physics loop `offer`s its state every `every` physics steps of `timestep`;
    `close` finishes the file and says how it went."""

    def __init__(self, path: str | Path, model: mujoco.MjModel, timestep: float, start: np.ndarray, fps: float = FPS):
        """`start`: the joint positions the run starts from, which the camera is framed on."""
        self.path = Path(path)
        self.every = max(1, round(1.0 / (fps * timestep)))
        """Physics steps per frame."""
        self.fps = 1.0 / (self.every * timestep)
        self.rendered = self.repeated = 0
        self.error: BaseException | None = None
        self._model, self._start = model, start.copy()
        self._latest: tuple[int, Shot] | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._started = threading.Event()
        self._seconds = 0.0
        # Mesa's software rasterizer would start a thread per core, taking the physics loop's core too.
        os.environ.setdefault("LP_NUM_THREADS", "1")
        self._thread = threading.Thread(target=self._run, name="sim-robot-video", daemon=True)
        self._thread.start()
        if not self._started.wait(STARTUP):
            raise RuntimeError(f"--record-video {self.path}: the renderer did not start in {STARTUP:g} s")
        if self.error is not None:
            raise self.error

    def offer(
        self,
        step: int,
        qpos: np.ndarray,
        lines: tuple[str, ...] = (),
        target: np.ndarray | None = None,
        radius: float = 0.03,
    ) -> None:
        """The state after physics step `step` (a multiple of `every`), copied, with the text to write and a
        target to mark (`radius` m); the newest one offered is the next rendered."""
        shot = Shot(qpos.copy(), lines, target, radius)
        with self._lock:
            self._latest = (step // self.every, shot)
            self._ready.set()

    def _run(self) -> None:
        width, height = VIDEO_SIZE
        with contextlib.suppress(OSError, AttributeError):  # Linux: a thread's nice value is its own
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), RENDER_NICE)
        try:
            filmer = Filmer(self._model, width, height, [self._start])
            # The first frame compiles shaders and loads the font, partly holding the GIL: done before the
            # physics loop starts, not in the middle of it.
            filmer.render(Shot(self._start, ("sim robot",)))
            video = VideoWriter(self.path, width, height, self.fps)
        except BaseException as err:  # said by the constructor, in the robot's thread
            self.error = err
            self._started.set()
            return
        self._started.set()
        frame, written = None, -1
        try:
            while True:
                self._ready.wait()
                with self._lock:
                    latest, self._latest = self._latest, None
                    self._ready.clear()
                    stopping = self._stopping
                if latest is not None:
                    slot, shot = latest
                    if frame is not None:
                        for _ in range(slot - written - 1):
                            video.write(frame)
                            self.repeated += 1
                    frame = filmer.render(shot)
                    video.write(frame)
                    self.rendered += 1
                    written = slot
                if stopping:
                    break
        except BaseException as err:
            self.error = err
        finally:
            self._seconds = video.frames / self.fps
            video.close()
            filmer.close()

    def close(self) -> str:
        """Render the last state offered, finish the file; the line to print about it."""
        with self._lock:
            self._stopping = True
            self._ready.set()
        self._thread.join()
        if self.error is not None:
            return f"sim robot: video {self.path} failed: {self.error}"
        frames = self.rendered + self.repeated
        line = f"sim robot: video {self.path}: {frames} frames, {self._seconds:.1f} s at {self.fps:g} fps"
        if self.repeated:
            line += (
                f"; rendering kept up with {self.rendered} of them, the other {self.repeated} repeat the frame "
                "before (a smaller video or a GPU renders faster)"
            )
        return line
