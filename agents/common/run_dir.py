"""Run directories: everything needed to reproduce, inspect or resume a run lives in one folder.

runs/<name>/config.yaml    resolved config (reloadable with `--preset runs/<name>/config.yaml`)
runs/<name>/meta.json      git SHA and dirty flag, versions, command line, start time
runs/<name>/metrics.jsonl  one JSON object per log step; metrics.csv mirrors it
runs/<name>/tb/            TensorBoard events
runs/<name>/curves.png     learning curves vs env steps and vs wall-clock
runs/<name>/wandb/         the wandb run, with `log.wandb` online or offline (`wandb sync` uploads an offline one)
runs/<name>/videos/        with `log.video`, the first episode of every evaluation: step_<N>.mp4
"""

from __future__ import annotations

import json
import netrc
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import yaml

from q2real.configs.loader import ConfigError, to_dict

_RUN_NAME = re.compile(r"[A-Za-z0-9._-]+")


@dataclass
class LogConfig:
    root: str = "runs"
    """Folder that holds run directories."""
    name: str = ""
    """Run directory name; empty means `<task>-<YYYYmmdd-HHMMSS>`."""
    tensorboard: bool = True
    """Also write the metrics as TensorBoard events, to the run directory's `tb/`."""
    wandb: Literal["off", "online", "offline"] = "off"
    """Weights & Biases mode; `online` needs credentials (WANDB_API_KEY or `wandb login`) and is refused
    before the run starts without them; `offline` writes the run under the run directory's `wandb/`."""
    wandb_project: str = "q2real"
    """Weights & Biases project the run is logged to (with `wandb` online or offline)."""
    interval_steps: int = 10_000
    """Env steps (summed over envs) between two metric records."""
    video: bool = False
    """Film the first episode of every evaluation to `videos/step_<N>.mp4` (rendered offscreen after the
    evaluation, a few seconds each; needs `pip install 'q2real[video]'` and EGL or OSMesa)."""

    def validate(self) -> None:
        """A run name is one folder inside `root`: no separators or `..` that would write elsewhere."""
        if self.name and (not _RUN_NAME.fullmatch(self.name) or self.name in (".", "..")):
            raise ValueError(
                f"log.name: expected a single folder name of letters, digits, '-', '_' and '.' (not '.' or '..'), "
                f"got {self.name!r}"
            )
        if self.interval_steps < 1:
            raise ValueError(f"log.interval_steps: expected >= 1, got {self.interval_steps}")

    def check_wandb_login(self) -> None:
        """Refuse `online` without credentials: wandb would log offline instead, and the run's metrics
        would never reach the dashboard its user is watching."""
        if self.wandb == "online" and not wandb_credentials():
            raise ConfigError(
                "log.wandb=online: no wandb credentials on this machine (WANDB_API_KEY is unset and `wandb login` "
                "has not been run); set WANDB_API_KEY or run `wandb login`, or use log.wandb=offline"
            )


def wandb_credentials() -> bool:
    """Whether wandb can log in without asking: an API key in the environment, or the netrc entry for its
    host that `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        return netrc.netrc(os.environ.get("NETRC") or None).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def git_state(path: Path) -> dict[str, Any]:
    """SHA and dirty flag of the checkout `path` lies in, or nulls outside a git checkout."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain") if sha else None
    return {"git_sha": sha, "git_dirty": bool(status) if status is not None else None}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


class RunDir:
    """Creates the run folder and writes the resolved config and provenance before any work starts."""

    def __init__(self, config: Any, log: LogConfig, task: str, resume: Path | None = None):
        """A new run directory, or with `resume` the existing one, whose meta.json then records the resume."""
        log.check_wandb_login()  # before anything is written
        if resume is None:
            log.validate()
            name = log.name or f"{task.replace(':', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
            self.path = Path(log.root) / name
            if (self.path / "config.yaml").exists():
                raise ConfigError(f"log.name: run directory {self.path} already holds a run; choose another name")
        else:
            self.path = Path(resume)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            where = "log.root" if resume is None else "--resume"
            raise ConfigError(f"{where}: cannot create the run directory {self.path}: {err.strerror}") from None
        self.config = config
        write_atomic(self.path / "config.yaml", yaml.safe_dump(to_dict(config), sort_keys=False))
        session = {
            **git_state(Path(__file__).resolve().parent),
            "command": sys.argv,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "versions": {p: _version(p) for p in ("q2real", "torch", "mujoco", "mujoco-mjx", "jax", "gymnasium")},
        }
        meta_path = self.path / "meta.json"
        if resume is not None and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            meta.setdefault("resumes", []).append(session)
        else:
            meta = session
        write_atomic(meta_path, json.dumps(meta, indent=2))

    def update_meta(self, **fields: Any) -> None:
        """Add or replace top-level fields of meta.json (atomically), e.g. what the run chose as it went."""
        path = self.path / "meta.json"
        write_atomic(path, json.dumps(json.loads(path.read_text()) | fields, indent=2))


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file and rename, so a crash never leaves a half-written file behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
