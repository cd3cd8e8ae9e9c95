"""Demonstrations as a LeRobotDataset v3 folder: what robotics users already record and share.

The `lerobot` package does not install beside q2real's pins (it pins torch 2.10 and its own wandb and
numpy), so the documented v3.0 layout is read and written here with `pyarrow`, state-only (no video):

    meta/info.json                          codebase_version, fps, features {dtype, shape, names}, paths
    meta/stats.json                         per feature: mean, std, min, max, count
    meta/tasks.parquet                      task_index, task
    meta/episodes/chunk-000/file-000.parquet  episode_index, length, dataset_from/to_index, data file, success
    data/chunk-000/file-000.parquet         one row per frame

Frame features: `observation.state` and `action` (float32 vectors; actions in the env's [-1, 1]),
`next.reward`, `next.done` (true only where the episode reached a terminal state), `next.success`
(the task's success test after the action), and LeRobot's `timestamp`, `frame_index`,
`episode_index`, `index`, `task_index`. An episode's last frame without `next.done` was truncated:
its successor state is not in the file, so replay drops that one transition. `info.json` carries a
`q2real` section (task, task_params, observation term names, how the data was made) that q2real
reads to rebuild the env; datasets from elsewhere simply lack it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from q2real.configs.errors import Q2RealError

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
VECTORS = ("observation.state", "action")
OPTIONAL = {"next.reward": "float32", "next.done": "bool", "next.success": "bool"}


class DatasetError(Q2RealError, ValueError):
    """A demonstration dataset that cannot be read as documented: the message names the file and field."""


@dataclass
class Demos:
    """Frames of whole episodes, in order; `episode` numbers them 0..E-1, contiguous."""

    obs: np.ndarray
    """(T, obs_dim) float32"""
    action: np.ndarray
    """(T, action_dim) float32, in [-1, 1]"""
    episode: np.ndarray
    """(T,) int64"""
    fps: float
    reward: np.ndarray | None = None
    """(T,) float32 reward after each action; None when the dataset has none."""
    terminal: np.ndarray | None = None
    """(T,) bool: the action led to a terminal state."""
    success: np.ndarray | None = None
    """(T,) bool: the task's success test after the action."""
    task: str = ""
    """The env it was recorded on (a q2real task or adapter name); empty when unknown."""
    q2real: dict[str, Any] = field(default_factory=dict)
    """What q2real wrote about the source: task_params, observation terms, how it was made."""

    def __post_init__(self) -> None:
        frames = len(self.obs)
        if self.obs.ndim != 2 or self.action.ndim != 2 or len(self.action) != frames or len(self.episode) != frames:
            raise DatasetError(
                f"demos: observation {self.obs.shape}, action {self.action.shape} and episode "
                f"{self.episode.shape} must be (T, n), (T, m) and (T,)"
            )
        for name in ("reward", "terminal", "success"):
            value = getattr(self, name)
            if value is not None and value.shape != (frames,):
                raise DatasetError(f"demos: {name} has shape {value.shape}, expected ({frames},)")

    @property
    def num_episodes(self) -> int:
        return int(self.episode[-1]) + 1 if len(self.episode) else 0

    def bounds(self) -> np.ndarray:
        """(E, 2) first frame and one past the last frame of every episode."""
        starts = np.flatnonzero(np.r_[True, self.episode[1:] != self.episode[:-1]])
        return np.stack([starts, np.r_[starts[1:], len(self.episode)]], axis=1)

    def episode_success(self) -> np.ndarray:
        """(E,) whether each episode ever passed the success test (all False without success flags)."""
        if self.success is None:
            return np.zeros(self.num_episodes, dtype=bool)
        return np.logical_or.reduceat(self.success, self.bounds()[:, 0])

    def select(self, episodes: np.ndarray) -> Demos:
        """The given episodes (indices, in that order), renumbered 0..len-1."""
        bounds = self.bounds()[np.asarray(episodes, dtype=np.int64)]
        frames = np.concatenate([np.arange(a, b) for a, b in bounds]) if len(bounds) else np.zeros(0, np.int64)
        numbers = np.repeat(np.arange(len(bounds)), bounds[:, 1] - bounds[:, 0])

        def pick(x: np.ndarray | None) -> np.ndarray | None:
            return None if x is None else x[frames]

        return Demos(
            obs=self.obs[frames],
            action=self.action[frames],
            episode=numbers,
            fps=self.fps,
            reward=pick(self.reward),
            terminal=pick(self.terminal),
            success=pick(self.success),
            task=self.task,
            q2real=self.q2real,
        )


def stats(x: np.ndarray) -> dict[str, list]:
    """LeRobot's per-feature statistics of a (T, n) array."""
    x = x.astype(np.float64).reshape(len(x), -1)
    return {
        "mean": x.mean(0).tolist(),
        "std": x.std(0).tolist(),
        "min": x.min(0).tolist(),
        "max": x.max(0).tolist(),
        "count": [len(x)],
    }


def write_lerobot(
    demos: Demos, root: str | Path, robot_type: str = "", names: dict[str, list[str]] | None = None
) -> Path:
    """Write `demos` as a new LeRobotDataset v3 folder at `root`, all or nothing (a temp folder renamed
    into place); refuses to overwrite an existing folder."""
    root = Path(root)
    if root.exists():
        raise DatasetError(f"{root}: already exists; demonstrations are written to a new folder")
    if not len(demos.obs):
        raise DatasetError(f"{root}: no frames to write")
    for name in ("obs", "action"):
        if not np.isfinite(getattr(demos, name)).all():
            raise DatasetError(f"{root}: {name} holds non-finite values; refusing to write them")
    names = names or {}
    frames = len(demos.obs)
    bounds = demos.bounds()
    frame_index = np.concatenate([np.arange(b - a) for a, b in bounds])
    columns: dict[str, Any] = {
        "observation.state": _vectors(demos.obs),
        "action": _vectors(demos.action),
        "timestamp": pa.array((frame_index / demos.fps).astype(np.float32)),
        "frame_index": pa.array(frame_index.astype(np.int64)),
        "episode_index": pa.array(demos.episode.astype(np.int64)),
        "index": pa.array(np.arange(frames, dtype=np.int64)),
        "task_index": pa.array(np.zeros(frames, dtype=np.int64)),
    }
    features: dict[str, Any] = {
        "observation.state": {
            "dtype": "float32",
            "shape": [demos.obs.shape[1]],
            "names": names.get("observation.state"),
        },
        "action": {"dtype": "float32", "shape": [demos.action.shape[1]], "names": names.get("action")},
    }
    for key, attr in (("next.reward", "reward"), ("next.done", "terminal"), ("next.success", "success")):
        value = getattr(demos, attr)
        if value is not None:
            columns[key] = pa.array(value.astype(OPTIONAL[key]))
            features[key] = {"dtype": OPTIONAL[key], "shape": [1], "names": None}
    for key in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        features[key] = {"dtype": "float32" if key == "timestamp" else "int64", "shape": [1], "names": None}

    tmp = root.with_name(f".{root.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data/chunk-000").mkdir(parents=True)
    (tmp / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(pa.table(columns), tmp / DATA_PATH.format(chunk_index=0, file_index=0))
    pq.write_table(pa.table({"task_index": [0], "task": [demos.task]}), tmp / "meta/tasks.parquet")
    episodes = {
        "episode_index": np.arange(len(bounds), dtype=np.int64),
        "tasks": [[demos.task]] * len(bounds),
        "length": (bounds[:, 1] - bounds[:, 0]).astype(np.int64),
        "dataset_from_index": bounds[:, 0].astype(np.int64),
        "dataset_to_index": bounds[:, 1].astype(np.int64),
        "data/chunk_index": np.zeros(len(bounds), dtype=np.int64),
        "data/file_index": np.zeros(len(bounds), dtype=np.int64),
        "success": demos.episode_success(),
    }
    pq.write_table(pa.table(episodes), tmp / EPISODES_PATH)
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": len(bounds),
        "total_frames": frames,
        "total_tasks": 1,
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": demos.fps,
        "splits": {"train": f"0:{len(bounds)}"},
        "data_path": DATA_PATH,
        "video_path": None,
        "features": features,
        "q2real": demos.q2real,
    }
    (tmp / "meta/info.json").write_text(json.dumps(info, indent=2, allow_nan=False))
    feature_stats = {"observation.state": stats(demos.obs), "action": stats(demos.action)}
    if demos.reward is not None:
        feature_stats["next.reward"] = stats(demos.reward[:, None])
    (tmp / "meta/stats.json").write_text(json.dumps(feature_stats, indent=2))
    os.replace(tmp, root)
    return root


def _vectors(x: np.ndarray) -> pa.FixedSizeListArray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


def read_lerobot(root: str | Path) -> Demos:
    """Read a LeRobotDataset v3 folder (state features only), checking every field q2real relies on."""
    root = Path(root)
    info_path = root / "meta/info.json"
    if not info_path.is_file():
        raise DatasetError(f"{root}: not a LeRobotDataset folder (no meta/info.json)")
    try:
        info = json.loads(info_path.read_text())
    except json.JSONDecodeError as err:
        raise DatasetError(f"{info_path}: not valid JSON ({err})") from err
    if not isinstance(info, dict):
        raise DatasetError(f"{info_path}: expected a JSON object")
    version = info.get("codebase_version")
    if not isinstance(version, str) or not version.startswith("v3"):
        raise DatasetError(f"{info_path}: codebase_version: expected a v3 dataset (v3.x), got {version!r}")
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps < math.inf:
        raise DatasetError(f"{info_path}: fps: expected a positive number, got {fps!r}")
    features = info.get("features")
    if not isinstance(features, dict):
        raise DatasetError(f"{info_path}: features: expected a mapping of feature name to {{dtype, shape}}")
    for key in VECTORS:
        spec = features.get(key)
        if not isinstance(spec, dict):
            raise DatasetError(f"{info_path}: features.{key}: missing; q2real needs state observations and actions")
        shape = spec.get("shape")
        if spec.get("dtype") not in ("float32", "float64") or not (
            isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) and shape[0] >= 1
        ):
            raise DatasetError(
                f"{info_path}: features.{key}: expected dtype float32 and shape [n], "
                f"got dtype {spec.get('dtype')!r} and shape {shape!r}"
            )
    files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    if not files:
        raise DatasetError(f"{root}: no data/chunk-*/file-*.parquet files")
    try:
        table = pa.concat_tables([pq.read_table(f) for f in files])
    except (pa.ArrowInvalid, OSError) as err:
        raise DatasetError(f"{root}/data: unreadable parquet ({err})") from err
    required = [*VECTORS, "episode_index", "frame_index"]
    for key in required:
        if key not in table.column_names:
            raise DatasetError(f"{root}/data: column {key!r} missing (features in info.json name it)")
    if "index" in table.column_names:
        table = table.sort_by("index")

    def vectors(key: str) -> np.ndarray:
        width = features[key]["shape"][0]
        column = table.column(key).combine_chunks()
        if not pa.types.is_list(column.type) and not pa.types.is_fixed_size_list(column.type):
            raise DatasetError(f"{root}/data: column {key!r}: expected a list of {width} numbers per frame")
        lengths = column.value_lengths().to_numpy(zero_copy_only=False)
        if (lengths != width).any():
            bad = int(np.flatnonzero(lengths != width)[0])
            raise DatasetError(
                f"{root}/data: column {key!r}: frame {bad} has {lengths[bad]} values, info.json says {width}"
            )
        values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, width)
        if not np.isfinite(values).all():
            bad = int(np.flatnonzero(~np.isfinite(values).all(1))[0])
            raise DatasetError(f"{root}/data: column {key!r}: frame {bad} holds a non-finite value")
        return values

    obs, action = vectors("observation.state"), vectors("action")
    episode = table.column("episode_index").to_numpy().astype(np.int64)
    frame = table.column("frame_index").to_numpy().astype(np.int64)
    _check_episodes(root, episode, frame)
    optional: dict[str, np.ndarray | None] = {}
    for key, dtype in OPTIONAL.items():
        if key in table.column_names:
            optional[key] = table.column(key).to_numpy(zero_copy_only=False).astype(dtype).reshape(-1)
        else:
            optional[key] = None
    reward = optional["next.reward"]
    if reward is not None and not np.isfinite(reward).all():
        bad = int(np.flatnonzero(~np.isfinite(reward))[0])
        raise DatasetError(f"{root}/data: column 'next.reward': frame {bad} holds a non-finite value")
    q2real = info.get("q2real") or {}
    if not isinstance(q2real, dict):
        raise DatasetError(f"{info_path}: q2real: expected a mapping, got {q2real!r}")
    task = q2real.get("task") or _task_name(root)
    return Demos(
        obs=obs,
        action=action,
        episode=episode,
        fps=float(fps),
        reward=reward,
        terminal=optional["next.done"],
        success=optional["next.success"],
        task=str(task),
        q2real=q2real,
    )


def _check_episodes(root: Path, episode: np.ndarray, frame: np.ndarray) -> None:
    """Episodes numbered 0..E-1 in order, each frame_index running 0..length-1, and agreeing with the
    episodes table when there is one."""
    if not len(episode):
        raise DatasetError(f"{root}/data: no frames")
    starts = np.r_[True, episode[1:] != episode[:-1]]
    numbers = episode[starts]
    if numbers[0] != 0 or (np.diff(numbers) != 1).any():
        raise DatasetError(f"{root}/data: episode_index: expected episodes 0, 1, 2, ... in order, got {numbers[:8]}...")
    expected = np.arange(len(episode)) - np.maximum.accumulate(np.where(starts, np.arange(len(episode)), 0))
    if (frame != expected).any():
        bad = int(np.flatnonzero(frame != expected)[0])
        raise DatasetError(f"{root}/data: frame_index of frame {bad} is {frame[bad]}, expected {expected[bad]}")
    path = root / EPISODES_PATH
    if not path.is_file():
        return
    table = pq.read_table(path)
    for key in ("episode_index", "dataset_from_index", "dataset_to_index"):
        if key not in table.column_names:
            raise DatasetError(f"{path}: column {key!r} missing")
    if table.num_rows != len(numbers):
        raise DatasetError(f"{path}: {table.num_rows} episodes listed, the data holds {len(numbers)}")
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(episode)]
    if (table.column("dataset_from_index").to_numpy() != first).any() or (
        table.column("dataset_to_index").to_numpy() != last
    ).any():
        raise DatasetError(f"{path}: dataset_from_index/dataset_to_index disagree with the frames' episode_index")


def _task_name(root: Path) -> str:
    path = root / "meta/tasks.parquet"
    if not path.is_file():
        return ""
    table = pq.read_table(path)
    return str(table.column("task")[0]) if "task" in table.column_names and table.num_rows else ""
