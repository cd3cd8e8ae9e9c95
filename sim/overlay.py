"""Text written on a rendered frame: the task's command and figures, legible over sky and floor alike."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np


@functools.lru_cache(maxsize=8)
def _font(size: int):
    """DejaVu Sans Mono, which matplotlib ships (figures line up in columns), else Pillow's own font."""
    import matplotlib
    from PIL import ImageFont

    mono = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSansMono.ttf"
    return ImageFont.truetype(str(mono), size) if mono.is_file() else ImageFont.load_default(size=size)


def text_size(height: int) -> int:
    """Font size (px) for a frame `height` px high: about 24 lines fit, and never below 10 px."""
    return max(10, height // 24)


def overlay_text(frame: np.ndarray, lines: Sequence[str]) -> np.ndarray:
    """`frame` (height, width, 3, uint8) with `lines` written top-left in white on a translucent dark band;
    the frame itself when there are none."""
    if not lines:
        return frame
    from PIL import Image, ImageDraw

    image = Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8))
    draw = ImageDraw.Draw(image, "RGBA")
    font = _font(text_size(frame.shape[0]))
    pad = max(2, frame.shape[0] // 100)
    text = "\n".join(lines)
    left, top, right, bottom = draw.multiline_textbbox((2 * pad, 2 * pad), text, font=font, spacing=pad)
    draw.rectangle((left - pad, top - pad, right + pad, bottom + pad), fill=(0, 0, 0, 150))
    draw.multiline_text((2 * pad, 2 * pad), text, font=font, fill=(255, 255, 255), spacing=pad)
    return np.asarray(image)
