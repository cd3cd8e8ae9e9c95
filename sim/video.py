"""Video files of rendered frames: H.264 MP4 through PyAV, which ships its own FFmpeg (no system FFmpeg
to install), and GIF through Pillow, small enough to show in a README."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import numpy as np

from q2real.configs.errors import MissingDependency
from q2real.configs.loader import ConfigError

GIF_WIDTH = 320
"""Widest GIF frame (px): a README shows it at about this size, and GIF's size grows with its area."""
GIF_FPS = 12.5
"""Highest GIF frame rate: motion still reads, at half the frames of a 25 fps video."""


def video_module() -> ModuleType:
    """PyAV, or an error that names the extra to install."""
    try:
        import av
    except ImportError as err:
        raise MissingDependency(f"video: needs PyAV: pip install 'q2real[video]' ({err})") from err
    return av


def check_size(width: int, height: int, where: str = "--width/--height") -> None:
    """H.264's 4:2:0 colour needs even sides."""
    if width < 16 or height < 16 or width % 2 or height % 2:
        raise ConfigError(f"{where}: expected even sizes of at least 16 px, got {width}x{height}")


class VideoWriter:
    """RGB frames (height, width, 3) of uint8 to an H.264 MP4 at `fps`, encoded as they come, so a long
    run never holds more than a frame."""

    def __init__(self, path: str | Path, width: int, height: int, fps: float):
        av = video_module()
        check_size(width, height)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.width, self.height = width, height
        self.fps = Fraction(fps).limit_denominator(1000)
        self._av = av
        self._container = av.open(str(self.path), mode="w")
        self._stream = self._container.add_stream("libx264", rate=self.fps)
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, "yuv420p"
        self._stream.options = {"crf": "23", "preset": "veryfast"}
        self.frames = 0
        self._open = True

    def write(self, frame: np.ndarray) -> None:
        if frame.shape != (self.height, self.width, 3):
            raise ValueError(f"{self.path}: frame of shape {frame.shape}, expected ({self.height}, {self.width}, 3)")
        picture = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(frame, dtype=np.uint8), format="rgb24")
        for packet in self._stream.encode(picture):
            self._container.mux(packet)
        self.frames += 1

    def close(self) -> None:
        """Flush the encoder and finish the file (a video closed without it does not play)."""
        if not self._open:
            return
        self._open = False
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *_) -> None:
        self.close()


class GifWriter:
    """Frames kept at most `GIF_WIDTH` wide and `GIF_FPS` per second (every k-th of a `fps` stream),
    written as one looping GIF by `close`."""

    def __init__(self, path: str | Path, fps: float):
        self.path = Path(path)
        self.every = max(1, round(fps / GIF_FPS))
        self.fps = fps / self.every
        self._frames: list[np.ndarray] = []
        self._seen = 0

    def add(self, frame: np.ndarray) -> None:
        if self._seen % self.every == 0:
            self._frames.append(_shrink(frame, GIF_WIDTH))
        self._seen += 1

    def close(self) -> None:
        if self._frames:
            write_gif(self.path, self._frames, self.fps)
        self._frames = []


def write_gif(path: str | Path, frames: Sequence[np.ndarray], fps: float) -> None:
    """`frames` as a looping GIF: one palette of 256 colours for the whole clip (drawn from its first,
    middle and last frames), so unchanged pixels keep their index and Pillow stores only what moved."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(np.asarray(frame, dtype=np.uint8)) for frame in frames]
    picks = sorted({0, len(images) // 2, len(images) - 1})
    sample = Image.fromarray(np.concatenate([np.asarray(images[i]) for i in picks], axis=0))
    palette = sample.quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    quantized = [image.quantize(palette=palette, dither=Image.Dither.NONE) for image in images]
    quantized[0].save(
        path,
        save_all=True,
        append_images=quantized[1:],
        duration=round(1000 / fps),
        loop=0,
        optimize=True,
    )


def _shrink(frame: np.ndarray, width: int) -> np.ndarray:
    if frame.shape[1] <= width:
        return frame
    from PIL import Image

    height = round(frame.shape[0] * width / frame.shape[1])
    return np.asarray(Image.fromarray(frame).resize((width, height), Image.Resampling.LANCZOS))
