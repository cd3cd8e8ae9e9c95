"""Checkpoint files: plain tensors and Python containers only, written atomically, verified on load.

A file is a two-line header, `q2real-checkpoint 1` and the hex sha256 of the payload, followed by the
`torch.save` payload. Loading checks the header and the hash before `torch.load(weights_only=True)`
(no pickled objects, so no code runs on load): a flipped bit in weights, replay or counters would
otherwise load and train on silently. The file is written to a temp file, fsynced, then renamed
over the old one: killing the process at any instant leaves either the previous checkpoint or the
new one, never a torn file.

Loading holds the payload bytes and the tensors built from them at once, about twice the
checkpoint's size in memory for a moment.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from q2real.configs.errors import Q2RealError

CHECKPOINT = "checkpoint.pt"


class CheckpointError(Q2RealError, ValueError):
    """A checkpoint is missing, damaged, or of a run this one cannot continue; the message names the key."""


MAGIC = b"q2real-checkpoint 1\n"
_DIGEST_LINE = 64 + 1  # hex sha256 and its newline


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write `state` with its header to `path`, atomically."""
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getbuffer()
    digest = hashlib.sha256(payload).hexdigest().encode()
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(MAGIC + digest + b"\n")
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The state saved at `path`, refused with a CheckpointError naming the file if it is not intact."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no checkpoint here")
    with open(path, "rb") as handle:
        magic = handle.read(len(MAGIC))
        digest_line = handle.read(_DIGEST_LINE)
        payload = handle.read()
    if magic != MAGIC:
        if magic.startswith(b"q2real-checkpoint "):
            raise CheckpointError(f"{path}: checkpoint header {magic.strip()!r}; this q2real reads {MAGIC.strip()!r}")
        raise CheckpointError(
            f"{path}: not a q2real checkpoint (no {MAGIC.strip().decode()!r} header): written by an older q2real, "
            "by another program, or damaged"
        )
    expected = digest_line[:-1].decode("ascii", errors="replace")
    actual = hashlib.sha256(payload).hexdigest()
    if digest_line[-1:] != b"\n" or expected != actual:
        raise CheckpointError(
            f"{path}: checkpoint is corrupted: its contents hash to sha256 {actual}, but {expected!r} was "
            "recorded when it was written; resume from a copy or start a new run"
        )
    try:
        return torch.load(io.BytesIO(payload), map_location=device, weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{path}: not a readable q2real checkpoint: {err}") from err


def check_config(path: Path, stored: Mapping[str, Any], current: Mapping[str, Any], keys: Iterable[str]) -> None:
    """Refuse when a dotted config key differs between checkpoint and run; keys the checkpoint lacks are skipped."""
    for key in keys:
        saved, now = _lookup(stored, key), _lookup(current, key)
        if saved is not _MISSING and saved != now:
            raise CheckpointError(f"{path}: {key}: checkpoint {saved!r}, this run {now!r}")


def check_shapes(path: Path, prefix: str, stored: Any, current: Any) -> None:
    """Refuse when the tensors of two state trees differ by name or shape, naming the first difference,
    so a mismatch reads as a key and two shapes instead of a `load_state_dict` traceback."""
    saved, now = _shapes(prefix, stored), _shapes(prefix, current)
    for key, shape in now.items():
        if key not in saved:
            raise CheckpointError(f"{path}: {key}: missing from the checkpoint, this run has shape {shape}")
        if saved[key] != shape:
            raise CheckpointError(f"{path}: {key}: checkpoint shape {saved[key]}, this run {shape}")
    for key, shape in saved.items():
        if key not in now:
            raise CheckpointError(f"{path}: {key}: in the checkpoint (shape {shape}) but not in this run")


_MISSING = object()


def _lookup(tree: Mapping[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, Mapping) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def _shapes(prefix: str, tree: Any) -> dict[str, tuple[int, ...]]:
    """Dotted name -> shape of every tensor in nested dicts and lists."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tuple(tree.shape)}
    if isinstance(tree, Mapping):
        items = tree.items()
    elif isinstance(tree, list | tuple):
        items = enumerate(tree)
    else:
        return {}
    shapes: dict[str, tuple[int, ...]] = {}
    for key, value in items:
        shapes |= _shapes(f"{prefix}.{key}", value)
    return shapes
