"""Import robomimic's hdf5 demonstrations (`data/demo_i/{obs/<key>, actions, rewards, dones}`).

robomimic writes every demo as one group; `data.attrs["env_args"]` (JSON) names the robosuite env.
Low-dimensional observation keys are concatenated in the order given (default: sorted), so the
same keys must be chosen when the policy later runs on the env; image keys are refused.
Its demos are human teleoperation that ended in success, and its sparse reward is 1 on success
steps, which is what the success flags are read from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from q2real.configs.errors import MissingDependency
from q2real.residual.dataset import DatasetError, Demos


def read_robomimic(path: str | Path, obs_keys: Sequence[str] | None = None) -> Demos:
    try:
        import h5py
    except ImportError as err:
        raise MissingDependency("robomimic import needs h5py: pip install 'q2real[robomimic]'") from err
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such robomimic hdf5 file")
    with h5py.File(path, "r") as f:
        if "data" not in f:
            raise DatasetError(f"{path}: no 'data' group; not a robomimic dataset")
        data: Any = f["data"]  # h5py's Group items are typed as a union; these are groups and datasets
        names = sorted((k for k in data if re.fullmatch(r"demo_\d+", k)), key=lambda k: int(k[5:]))
        if not names:
            raise DatasetError(f"{path}: data holds no demo_<i> groups")
        first: Any = data[names[0]]
        if "obs" not in first:
            raise DatasetError(f"{path}: data/{names[0]}/obs missing")
        keys = list(obs_keys) if obs_keys else sorted(first["obs"])
        parts: dict[str, list[np.ndarray]] = {"obs": [], "action": [], "reward": [], "terminal": [], "episode": []}
        for i, name in enumerate(names):
            demo: Any = data[name]
            for key in ("actions", "rewards", "dones"):
                if key not in demo:
                    raise DatasetError(f"{path}: data/{name}/{key} missing")
            actions = np.asarray(demo["actions"], dtype=np.float32)
            steps = len(actions)
            observed = []
            for key in keys:
                where = f"data/{name}/obs/{key}"
                if key not in demo.get("obs", {}):
                    raise DatasetError(f"{path}: {where} missing (obs keys: {keys})")
                value = np.asarray(demo["obs"][key], dtype=np.float32)
                if value.ndim > 2:
                    raise DatasetError(f"{path}: {where} is an image {value.shape}; only low-dimensional keys import")
                if len(value) != steps:
                    raise DatasetError(f"{path}: {where} has {len(value)} steps, actions has {steps}")
                observed.append(value.reshape(steps, -1))
            for key in ("rewards", "dones"):
                if len(demo[key]) != steps:
                    raise DatasetError(f"{path}: data/{name}/{key} has {len(demo[key])} steps, actions has {steps}")
            parts["obs"].append(np.concatenate(observed, axis=1))
            parts["action"].append(actions)
            parts["reward"].append(np.asarray(demo["rewards"], dtype=np.float32))
            parts["terminal"].append(np.asarray(demo["dones"]).astype(bool))
            parts["episode"].append(np.full(steps, i, dtype=np.int64))
        env_args = _env_args(path, data.attrs.get("env_args"))
    reward = np.concatenate(parts["reward"])
    obs, action = np.concatenate(parts["obs"]), np.concatenate(parts["action"])
    for name, value in (("obs", obs), ("actions", action), ("rewards", reward)):
        if not np.isfinite(value).all():
            raise DatasetError(f"{path}: {name} hold non-finite values")
    if (np.abs(action) > 1 + 1e-6).any():
        raise DatasetError(f"{path}: actions outside [-1, 1]; q2real's envs take normalized actions")
    env_name = env_args.get("env_name", "")
    kwargs = env_args.get("env_kwargs", {})
    fps = float(kwargs.get("control_freq", 20)) if isinstance(kwargs, dict) else 20.0
    return Demos(
        obs=obs,
        action=action,
        episode=np.concatenate(parts["episode"]),
        fps=fps,
        reward=reward,
        terminal=np.concatenate(parts["terminal"]),
        success=reward > 0,
        task=f"robosuite:{env_name}" if env_name else "",
        q2real={"source": f"robomimic {path.name}", "obs_keys": keys, "env_args": env_args},
    )


def _env_args(path: Path, raw) -> dict:
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, json.JSONDecodeError) as err:
        raise DatasetError(f"{path}: data.attrs['env_args'] is not JSON ({err})") from err
    if not isinstance(value, dict):
        raise DatasetError(f"{path}: data.attrs['env_args']: expected a JSON object")
    return value
