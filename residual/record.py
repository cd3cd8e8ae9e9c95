"""Roll a policy (a scripted expert, a bundle) out on a task and keep its episodes as demonstrations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from q2real.agents.common.progress import Progress
from q2real.residual.dataset import Demos
from q2real.sim import EnvConfig, VecEnv


@dataclass
class RecordConfig:
    env: EnvConfig = field(default_factory=lambda: EnvConfig(task="panda_reach", num_envs=8))
    """The task recorded on; its envs run in parallel and every one steps until enough episodes ended."""
    episodes: int = 50
    """Episodes the dataset keeps (only successful ones with `successful_only`)."""
    out: str = ""
    """The new dataset folder."""
    policy: str = "expert"
    """`expert` (the task's scripted expert) or a policy bundle (.onnx)."""
    successful_only: bool = False
    """Keep recording until `episodes` episodes succeeded, and keep only those."""
    seed: int = 0
    """Seed of the episodes' initial states (the env's reset); `env.seed` seeds its randomized physics."""

    def validate(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes: expected >= 1, got {self.episodes}")


@dataclass
class Recorded:
    demos: Demos
    success_rate: float
    """Over every episode recorded (kept or not)."""
    episodes_recorded: int


def record(
    env: VecEnv,
    policy: Callable[[torch.Tensor], torch.Tensor],
    episodes: int,
    env_config: EnvConfig,
    source: str,
    reset: Callable[[torch.Tensor], None] | None = None,
    successful_only: bool = False,
    seed: int = 0,
) -> Recorded:
    """Step all of `env`'s envs with `policy` until `episodes` episodes have finished (`successful_only`:
    until that many succeeded), then cut the per-env streams into episodes, in the order they ended.
    `reset(done)` tells a stateful policy which envs started over."""
    if episodes < 1:
        raise ValueError(f"episodes: expected >= 1, got {episodes}")
    n = env.num_envs
    steps: dict[str, list[torch.Tensor]] = {k: [] for k in ("obs", "action", "reward", "terminal", "success", "done")}
    obs = env.reset(seed=seed)
    kept = finished = succeeded = 0
    running = torch.zeros(n, dtype=torch.bool, device=env.device)
    progress = Progress(episodes, "recording", unit="episode")
    limit = 1000 * episodes
    while kept < episodes:
        action = policy(obs)
        result = env.step(action)
        success = result.info.get("success")
        success = torch.zeros(n, dtype=torch.bool, device=env.device) if success is None else success.bool()
        for key, value in (
            ("obs", obs),
            ("action", action),
            ("reward", result.reward),
            ("terminal", result.terminated),
            ("success", success),
            ("done", result.done),
        ):
            steps[key].append(value.detach().cpu())
        running |= success
        done = result.done
        if reset is not None:
            reset(done)
        # One host read per tick: a recorder, not a training loop.
        ended, ended_ok = int(done.sum()), int((done & running).sum())
        finished, succeeded = finished + ended, succeeded + ended_ok
        gained = ended_ok if successful_only else ended
        kept += gained
        progress.update(gained)
        running &= ~done
        obs = result.obs
        if len(steps["obs"]) * n > limit and kept < episodes:
            progress.close()
            raise RuntimeError(
                f"recording: {kept} of {episodes} episodes after {len(steps['obs'])} ticks; "
                f"the policy rarely {'succeeds' if successful_only else 'finishes an episode'}"
            )
    progress.close()
    stacked = {k: torch.stack(v).numpy() for k, v in steps.items()}  # (ticks, n, ...)
    pieces = []
    for e in range(n):
        ends = np.flatnonzero(stacked["done"][:, e])
        starts = np.r_[0, ends[:-1] + 1]
        for start, end in zip(starts, ends, strict=True):
            ok = bool(stacked["success"][start : end + 1, e].any())
            if ok or not successful_only:
                pieces.append((end, e, start, ok))
    pieces.sort()
    pieces = pieces[:episodes]
    take = {k: [] for k in stacked}
    numbers = []
    for i, (end, e, start, _) in enumerate(pieces):
        for key, value in stacked.items():
            take[key].append(value[start : end + 1, e])
        numbers.append(np.full(end + 1 - start, i, dtype=np.int64))
    demos = Demos(
        obs=np.concatenate(take["obs"]).astype(np.float32),
        action=np.concatenate(take["action"]).astype(np.float32),
        episode=np.concatenate(numbers),
        fps=1.0 / env.control_period if env.control_period else 0.0,
        reward=np.concatenate(take["reward"]).astype(np.float32),
        terminal=np.concatenate(take["terminal"]).astype(bool),
        success=np.concatenate(take["success"]).astype(bool),
        task=env_config.task,
        q2real={
            "task": env_config.task,
            "task_params": dict(env_config.task_params),
            "observation_terms": [
                {"name": name, "dim": dim}
                for name, dim in zip(getattr(env, "obs_names", ()), getattr(env, "obs_dims", ()), strict=True)
            ],
            "source": source,
            "success_rate": succeeded / max(finished, 1),
            "episodes_recorded": finished,
            "successful_only": successful_only,
        },
    )
    return Recorded(demos, succeeded / max(finished, 1), finished)
