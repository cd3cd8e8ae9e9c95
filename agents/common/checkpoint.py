"""Checkpoint files: plain tensors and Python containers only, written atomically.

A checkpoint loads with `torch.load(weights_only=True)` (no pickled objects, so no code runs on load),
and is written to a temp file, fsynced, then renamed over the old one: killing the process at any
instant leaves either the previous checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no checkpoint here")
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as err:
        raise ValueError(f"{path}: not a readable q2real checkpoint: {err}") from err
