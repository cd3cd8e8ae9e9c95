"""`q2real render`: a policy on its robot, filmed in simulation, to an MP4 (and a GIF small enough for a README).

The policy acts as `q2real eval` runs it: a bundle through onnxruntime, as on the robot; a run directory's
checkpoint (its bundle for BC and residual runs), on seeded episodes of the env it trained on, one env
per episode. An `EpisodeFilm` records every episode's frames as the evaluation goes and renders them
with MuJoCo's offscreen renderer afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from q2real.configs.loader import ConfigError, merge
from q2real.gate.evaluation import evaluate_bundle, evaluate_run, run_env_config
from q2real.sim import EnvConfig
from q2real.sim.filming import FPS, EpisodeFilm, check_filming
from q2real.sim.video import check_size


@dataclass(frozen=True)
class RenderSettings:
    seconds: float = 10.0
    """Seconds of each episode to film (at most the episode)."""
    episodes: int = 1
    """Episodes to film, one after the other."""
    seed: int = 12345
    """Seed of the evaluation's episodes (`q2real eval --seed`)."""
    width: int = 640
    height: int = 480
    fps: float = FPS
    """Frames per second aimed at: the nearest rate a whole number of control steps gives."""
    gif: bool = False
    """Also write a GIF beside the MP4 (at most 320 px wide and 12.5 fps)."""


@dataclass(frozen=True)
class Rendered:
    video: Path
    frames: int
    fps: float
    gif: Path | None
    returns: torch.Tensor
    """Each filmed episode's whole return (the film may end before the episode does)."""


def bundle_env_config(bundle: Path) -> EnvConfig:
    """The env a bundle was trained on (its metadata's `training.config.env`), or its task's defaults
    where the metadata does not say."""
    from q2real.deploy_ros.bundle import PolicyBundle

    meta = PolicyBundle(bundle, warmup=0).info.metadata
    env = meta.get("training", {}).get("config", {}).get("env")
    if isinstance(env, dict):
        return merge(EnvConfig(), env, f"{bundle}: metadata.training.config", prefix="env.")
    return EnvConfig(task=str(meta["task"]))


def render(
    source: str | Path,
    out: str | Path | None = None,
    settings: RenderSettings | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Rendered:
    """Film the policy of `source` (a run directory or a bundle `.onnx`) to `out` (default: the bundle's
    name with `.mp4`, or `<run dir>/videos/policy.mp4`); `progress(done, total)` after each frame."""
    settings = settings or RenderSettings()
    source = Path(source)
    check_size(settings.width, settings.height)
    if source.is_dir():
        env_config = run_env_config(source)
        default = source / "videos" / "policy.mp4"
    elif source.suffix == ".onnx" and source.is_file():
        env_config = bundle_env_config(source)
        default = source.with_suffix(".mp4")
    else:
        raise ConfigError(f"{source}: expected a training run directory or a policy bundle (.onnx file)")
    video = Path(out) if out is not None else default
    if video.suffix.lower() != ".mp4":
        raise ConfigError(f"--out {video}: expected a path ending in .mp4")
    check_filming(env_config.task, f"{source}: env.task")
    film = EpisodeFilm(f"{env_config.task}  {source.name}", settings.episodes, settings.seconds, settings.fps)
    if source.is_dir():
        returns = evaluate_run(source, settings.episodes, settings.seed, watch=film)
    else:
        returns = evaluate_bundle(env_config, source, settings.episodes, settings.seed, film)
    gif = video.with_suffix(".gif") if settings.gif else None
    written = film.write(video, settings.width, settings.height, gif, progress)
    return Rendered(video, written.frames, float(written.fps), gif, returns)
