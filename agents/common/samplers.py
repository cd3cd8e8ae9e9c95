"""How learners draw from replay: uniformly, by priority (PER), or in D-SPEAR's two streams.

Prioritized sampling runs on the training device: a sum tree over every slot of the replay storage,
updated and sampled for whole batches with no Python loop over elements. Slot k is storage row
k // num_envs, env k % num_envs, so all N envs' transitions of one collection step are one contiguous
run of leaves, and overwriting a ring row rewrites its leaves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numba
import numpy as np
import torch

from q2real.agents.common.replay import Batch, ReplayStorage


@numba.njit(cache=True)
def _set_cpu(nodes, starts, fanout, index, value):  # pragma: no cover - compiled
    for i in range(index.shape[0]):
        nodes[starts[0] + index[i]] = value[i]
    for i in range(index.shape[0]):
        node = index[i]
        for j in range(1, starts.shape[0]):
            node //= fanout
            first = starts[j - 1] + node * fanout
            total = 0.0
            for c in range(fanout):
                total += nodes[first + c]
            nodes[starts[j] + node] = total


@numba.njit(cache=True)
def _sample_cpu(nodes, starts, fanout, offsets, out):  # pragma: no cover - compiled
    """Stratified: sample b falls in the b-th of len(offsets) equal slices of the total mass."""
    top = starts.shape[0] - 1
    total = nodes[starts[top]]
    count = offsets.shape[0]
    for b in range(count):
        m = (b + offsets[b]) / count * total
        node = 0
        for j in range(top - 1, -1, -1):
            first = starts[j] + node * fanout
            pick, last, acc = -1, 0, 0.0
            for c in range(fanout):
                v = nodes[first + c]
                if v > 0:
                    last = c
                    if m < acc + v:
                        pick = c
                        break
                    acc += v
            if pick < 0:  # rounding ran past the end: take the last non-empty child, near its end
                pick = last
                m = nodes[first + last] * (1.0 - 1e-12)
            else:
                m -= acc
            node = node * fanout + pick
        out[b] = node


class SumTree:
    """A sum tree with `fanout` children per node: log_fanout(size) levels (4 for 1M slots at 32).

    All levels live in one flat float64 tensor (`levels[0]` the leaves, `levels[-1]` the root). On a
    GPU, a batch is a few dozen tensor ops (per level: gather, cumsum, searchsorted); on the CPU, where
    per-op overhead would dominate, the same walk is a compiled loop over the tensor's memory.
    """

    def __init__(self, size: int, device: torch.device, fanout: int = 32, compiled: bool | None = None):
        """`compiled`: use the compiled CPU walk (default: on the CPU); False forces the tensor-op path."""
        self.size, self.fanout = size, fanout
        depth = max(1, math.ceil(math.log(max(size, 2), fanout) - 1e-9))
        sizes = [fanout ** (depth - j) for j in range(depth + 1)]
        self.nodes = torch.zeros(sum(sizes), dtype=torch.float64, device=device)
        starts = [sum(sizes[:j]) for j in range(depth + 1)]
        self.levels = [self.nodes[start : start + n] for start, n in zip(starts, sizes, strict=True)]
        self._cpu = device.type == "cpu" if compiled is None else compiled
        self._starts = np.asarray(starts, dtype=np.int64)

    @property
    def total(self) -> torch.Tensor:
        return self.levels[-1][0]

    def get(self, index: torch.Tensor) -> torch.Tensor:
        return self.levels[0][index]

    def set(self, index: torch.Tensor, value: torch.Tensor) -> None:
        """Set leaves `index` to `value` (later duplicates win) and repair the sums above them."""
        value = value.to(torch.float64)
        if self._cpu:
            _set_cpu(self.nodes.numpy(), self._starts, self.fanout, index.numpy(), value.numpy())
            return
        self.levels[0][index] = value
        node = index
        for below, level in zip(self.levels, self.levels[1:], strict=False):
            node = node // self.fanout
            # Duplicate parents are fine: each writes the same sum of the same children.
            level[node] = below.view(-1, self.fanout)[node].sum(dim=1)

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """The leaf whose prefix-sum interval contains each `mass` in [0, total) (tensor-op walk)."""
        mass = mass.to(torch.float64).unsqueeze(1)
        node = torch.zeros(mass.shape[0], dtype=torch.long, device=mass.device)
        last = torch.arange(self.fanout, device=mass.device)
        for level in reversed(self.levels[:-1]):
            children = level.view(-1, self.fanout)[node]  # (B, fanout)
            cum = children.cumsum(dim=1)
            pick = torch.searchsorted(cum, mass, right=True)
            # Never step into an empty child (rounding at the very end of the total could).
            nonempty = torch.where(children > 0, last, 0).amax(dim=1, keepdim=True)
            pick = torch.minimum(pick, nonempty)
            mass = mass - torch.where(pick > 0, cum.gather(1, (pick - 1).clamp_min(0)), 0.0)
            node = node * self.fanout + pick.squeeze(1)
        return node

    def sample(self, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """`count` leaves with probability proportional to their values (stratified over the total)."""
        device = self.nodes.device
        offsets = torch.rand(count, generator=generator, device=device, dtype=torch.float64)
        if self._cpu:
            out = torch.empty(count, dtype=torch.long)
            _sample_cpu(self.nodes.numpy(), self._starts, self.fanout, offsets.numpy(), out.numpy())
            return out
        mass = (torch.arange(count, device=device, dtype=torch.float64) + offsets) / count * self.total
        return self.find(mass)


@dataclass
class SamplerConfig:
    """How the learners draw from replay. `dspear` is D-SPEAR's dual-stream prioritized replay.

    D-SPEAR (Zhang & Mason 2026; only the abstract is public) as built here, on LA3P's design (Saglam
    et al. 2023): the critic stream mixes prioritized (p = (|delta| + eps)^alpha) and uniform samples,
    weighted by importance weights for the mixture and trained with a Huber TD loss; the actor stream
    draws low-|delta| transitions with probability proportional to 1/p (LA3P's inverse priority); the
    anchor sets the prioritized fraction from the coefficient of variation of recent |delta|,
    rho = clip(anchor_gain * CV / (1 + CV), rho_min, rho_max): uniform-leaning when errors are alike
    (CV -> 0), priority-leaning when a few transitions carry most of the error (CV large), bounded so
    neither stream starves. The mapping is our choice (the paper's is not public).
    """

    kind: Literal["uniform", "prioritized", "dspear"] = "uniform"
    """`uniform`; `prioritized`, PER (Schaul et al. 2016): transitions drawn in proportion to
    (|TD error| + eps)^alpha, corrected by importance weights; `dspear`, the two streams above."""
    alpha: float = 0.6
    """Priority exponent: 0 samples uniformly, 1 in full proportion to |TD error| + eps."""
    beta: float = 0.4
    """Initial importance-weight exponent, annealed linearly to 1 over `beta_steps` critic updates."""
    beta_steps: int = 100_000
    """Critic updates over which the importance-weight exponent rises from `beta` to 1."""
    eps: float = 1e-3
    """Added to |TD error| before the exponent, so no transition's priority falls to zero."""
    critic_stream: bool = True
    """dspear: prioritized critic batches with IS weights and a Huber loss (off: uniform critic)."""
    actor_stream: bool = True
    """dspear: low-|delta| actor batches (off: the actor trains on the critic's batch)."""
    anchor: bool = True
    """dspear: CV-driven prioritized fraction (off: fully prioritized critic batches)."""
    anchor_gain: float = 1.0
    """dspear: the gain in rho = clip(anchor_gain * CV / (1 + CV), rho_min, rho_max)."""
    rho_min: float = 0.1
    """dspear: the smallest prioritized fraction of a critic batch, so the prioritized stream never starves."""
    rho_max: float = 0.9
    """dspear: the largest prioritized fraction of a critic batch, so the uniform stream never starves."""
    cv_smoothing: float = 0.99
    """EMA factor of the CV estimate over critic batches."""

    def validate(self) -> None:
        checks = [
            (self.alpha >= 0, "alpha", ">= 0"),
            (0 <= self.beta <= 1, "beta", "in [0, 1]"),
            (self.beta_steps >= 1, "beta_steps", ">= 1"),
            (self.eps > 0, "eps", "> 0"),
            (0 <= self.rho_min <= self.rho_max <= 1, "rho_min/rho_max", "0 <= rho_min <= rho_max <= 1"),
            (0 <= self.cv_smoothing < 1, "cv_smoothing", "in [0, 1)"),
        ]
        for ok, key, expected in checks:
            if not ok:
                raise ValueError(f"sampler.{key}: expected {expected}")


class UniformSampler:
    """Every stored transition equally likely; one batch serves critic and actor."""

    def sample(self, storage: ReplayStorage, batch_size: int, n_step: int, gamma: float, chunk: int) -> Batch:
        row = torch.randint(0, storage.size, (batch_size,), device=storage.device)
        env = torch.randint(0, storage.num_envs, (batch_size,), device=storage.device)
        return storage.gather(row, env, n_step, gamma, chunk)

    def sample_actor(
        self, storage: ReplayStorage, batch_size: int, n_step: int, gamma: float, chunk: int
    ) -> Batch | None:
        return None

    def on_add(self, storage: ReplayStorage) -> None: ...

    def update(self, batch: Batch, td_abs: torch.Tensor) -> None: ...

    def metrics(self) -> dict[str, torch.Tensor]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None: ...


class PrioritizedSampler(UniformSampler):
    """Prioritized experience replay (Schaul et al. 2016), and D-SPEAR's two streams over it.

    Its statistics (largest priority, the TD-error CV and the anchored fraction) stay on the training
    device: sampling and priority updates never read a value back to the host.
    """

    def __init__(self, config: SamplerConfig, storage: ReplayStorage):
        self.config = config
        self.dual = config.kind == "dspear"
        self.num_envs = storage.num_envs
        self.device = storage.device
        size = storage.rows * storage.num_envs
        self.priority = SumTree(size, storage.device)
        self.inverse = SumTree(size, storage.device)
        self.max_priority = torch.ones((), dtype=torch.float64, device=storage.device)
        self.critic_updates = 0
        self.cv = torch.zeros((), device=storage.device)

    @property
    def rho(self) -> torch.Tensor | float:
        """Fraction of each critic batch drawn by priority: fixed by the config, or anchored to the CV."""
        cfg = self.config
        if not self.dual or (cfg.critic_stream and not cfg.anchor):
            return 1.0
        if not cfg.critic_stream:
            return 0.0
        return (cfg.anchor_gain * self.cv / (1 + self.cv)).clamp(cfg.rho_min, cfg.rho_max)

    @property
    def beta(self) -> float:
        cfg = self.config
        return min(1.0, cfg.beta + (1 - cfg.beta) * self.critic_updates / cfg.beta_steps)

    def on_add(self, storage: ReplayStorage) -> None:
        """New transitions (the row just written) get the largest priority seen, so each is replayed soon."""
        row = (storage.pos - 1) % storage.rows
        slots = row * storage.num_envs + torch.arange(storage.num_envs, device=storage.device)
        p = self.max_priority.expand(storage.num_envs).contiguous()
        self.priority.set(slots, p)
        self.inverse.set(slots, 1.0 / p)

    def sample(self, storage: ReplayStorage, batch_size: int, n_step: int, gamma: float, chunk: int) -> Batch:
        rho, filled = self.rho, len(storage)
        weight = None
        if isinstance(rho, float) and rho == 0.0:
            slots = torch.randint(0, filled, (batch_size,), device=storage.device)
        elif isinstance(rho, float):
            slots = self.priority.sample(batch_size)
            # Importance weights (N P(i))^-beta over the batch maximum reduce to (p_min / p)^beta.
            p = self.priority.get(slots)
            weight = (p.min() / p).pow(self.beta).float()
        else:
            # Each sample comes from the prioritized stream with probability rho, else uniformly: the
            # mixture q(i) = rho p_i / sum p + (1 - rho) / N, drawn without reading rho back.
            prior = self.priority.sample(batch_size)
            uniform = torch.randint(0, filled, (batch_size,), device=storage.device)
            slots = torch.where(torch.rand(batch_size, device=storage.device) < rho, prior, uniform)
            q = rho * self.priority.get(slots) / self.priority.total + (1 - rho) / filled
            mixture = (q * filled).pow(-self.beta)
            weight = (mixture / mixture.max()).float()
        batch = storage.gather(slots // storage.num_envs, slots % storage.num_envs, n_step, gamma, chunk)
        batch.weight = weight
        self.critic_updates += 1
        return batch

    def sample_actor(
        self, storage: ReplayStorage, batch_size: int, n_step: int, gamma: float, chunk: int
    ) -> Batch | None:
        if not (self.dual and self.config.actor_stream):
            return None
        slots = self.inverse.sample(batch_size)
        return storage.gather(slots // storage.num_envs, slots % storage.num_envs, n_step, gamma, chunk)

    def update(self, batch: Batch, td_abs: torch.Tensor) -> None:
        cfg = self.config
        p = (td_abs.double() + cfg.eps).pow(cfg.alpha)
        slots = batch.row * self.num_envs + batch.env
        self.priority.set(slots, p)
        self.inverse.set(slots, 1.0 / p)
        self.max_priority = torch.maximum(self.max_priority, p.max())
        mean = td_abs.mean()
        cv = torch.where(mean > 0, td_abs.std() / mean, 0.0)
        self.cv = cv if self.critic_updates <= 1 else cfg.cv_smoothing * self.cv + (1 - cfg.cv_smoothing) * cv

    def metrics(self) -> dict[str, torch.Tensor]:
        rho = torch.as_tensor(self.rho, dtype=torch.float32, device=self.device)
        beta = torch.tensor(self.beta, device=self.device)
        return {"replay/td_cv": self.cv.float(), "replay/prioritized_fraction": rho, "replay/beta": beta}

    def state_dict(self) -> dict:
        return {
            "priority": self.priority.nodes,
            "inverse": self.inverse.nodes,
            "max_priority": self.max_priority,
            "critic_updates": self.critic_updates,
            "cv": self.cv,
        }

    def load_state_dict(self, state: dict) -> None:
        if not state:  # a checkpoint of a uniformly sampled run: priorities start fresh
            return
        self.priority.nodes.copy_(state["priority"])
        self.inverse.nodes.copy_(state["inverse"])
        self.max_priority = torch.as_tensor(state["max_priority"], dtype=torch.float64, device=self.device)
        self.critic_updates = int(state["critic_updates"])
        self.cv = torch.as_tensor(state["cv"], dtype=torch.float32, device=self.device)


def make_sampler(config: SamplerConfig, storage: ReplayStorage) -> UniformSampler:
    return UniformSampler() if config.kind == "uniform" else PrioritizedSampler(config, storage)
