"""Demonstrations as replay, and RLPD's symmetric sampling: every batch half demos, half online data.

The demonstrations become one replay stream (rows = frames, one env column), so n-step and chunk
windows cut at their episode ends exactly as online ones do. LeRobot frames carry no successor
state: inside an episode s' is the next frame; an episode's last frame is kept where it reached a
terminal state (s' is then never bootstrapped from) and dropped where it was truncated, its
predecessor then ending the window as a truncation that bootstraps from that last frame.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from q2real.agents.common.replay import Batch, Prefixes, ReplayStorage
from q2real.agents.common.samplers import UniformSampler
from q2real.residual.dataset import DatasetError, Demos
from q2real.sim.vec_env import StepResult


def demo_storage(
    demos: Demos, device: torch.device, extend: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> ReplayStorage:
    """One replay stream of the demonstrations' transitions; `extend` maps raw observations to what the
    learner observes (a residual's: with the base action appended)."""
    if demos.reward is None:
        raise DatasetError("residual.demos: the dataset has no next.reward; RL from demonstrations needs rewards")
    terminal = demos.terminal if demos.terminal is not None else np.zeros(len(demos.obs), dtype=bool)
    bounds = demos.bounds()
    last = bounds[:, 1] - 1
    keep = np.ones(len(demos.obs), dtype=bool)
    keep[last[~terminal[last]]] = False  # truncated ends: no successor state recorded
    if not keep.any():
        raise DatasetError("residual.demos: no transition with a recorded successor (every episode is one frame)")
    index = np.flatnonzero(keep)
    successor = np.minimum(index + 1, len(demos.obs) - 1)
    truncated = np.zeros(len(demos.obs), dtype=bool)
    cut = (bounds[:, 1] - bounds[:, 0] >= 2) & ~terminal[last]
    truncated[last[cut] - 1] = True  # the window ends where the dropped frame was its successor
    obs = torch.as_tensor(demos.obs, device=device)
    if extend is not None:
        obs = extend(obs)
    pick = torch.as_tensor(index, device=device)
    storage = ReplayStorage(len(index), 1, obs.shape[1], demos.action.shape[1], device)
    next_obs = obs[torch.as_tensor(successor, device=device)][:, None]
    result = StepResult(
        obs=next_obs,
        next_obs=next_obs,
        reward=torch.as_tensor(demos.reward[index], device=device)[:, None],
        terminated=torch.as_tensor(terminal[index], device=device)[:, None],
        truncated=torch.as_tensor(truncated[index], device=device)[:, None],
        cost=torch.zeros(len(index), 1, device=device),
    )
    storage.extend(obs[pick][:, None], torch.as_tensor(demos.action[index], device=device)[:, None], result)
    return storage


class DemoMixSampler(UniformSampler):
    """Uniform over online replay for `1 - fraction` of each batch and over the demonstrations for the
    rest, concatenated (RLPD, Ball et al. 2023: 50/50). Stateless, so a resume needs nothing saved."""

    def __init__(self, demos: ReplayStorage, fraction: float):
        self.demos, self.fraction = demos, fraction

    def sample(self, storage: ReplayStorage, batch_size: int, n_step: int, gamma: float, chunk: int) -> Batch:
        from_demos = round(batch_size * self.fraction)
        online = super().sample(storage, batch_size - from_demos, n_step, gamma, chunk)
        demo = super().sample(self.demos, from_demos, n_step, gamma, chunk)
        return cat_batches(online, demo)


def cat_batches(a: Batch, b: Batch) -> Batch:
    """`a` then `b`; row/env index each one's own storage (only prioritized samplers read them)."""
    prefixes = None
    if a.prefixes is not None and b.prefixes is not None:
        prefixes = Prefixes(
            reward=torch.cat([a.prefixes.reward, b.prefixes.reward]),
            discount=torch.cat([a.prefixes.discount, b.prefixes.discount]),
            next_obs=torch.cat([a.prefixes.next_obs, b.prefixes.next_obs]),
        )
    return Batch(
        obs=torch.cat([a.obs, b.obs]),
        action=torch.cat([a.action, b.action]),
        reward=torch.cat([a.reward, b.reward]),
        next_obs=torch.cat([a.next_obs, b.next_obs]),
        discount=torch.cat([a.discount, b.discount]),
        row=torch.cat([a.row, b.row]),
        env=torch.cat([a.env, b.env]),
        cost=torch.cat([a.cost, b.cost]),
        prefixes=prefixes,
    )
