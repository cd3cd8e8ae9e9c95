"""Executing action chunks: which action goes out on each tick when a policy predicts h at a time.

A chunk policy maps one observation to h actions, one per control tick. It is queried every
`execute` ticks (receding horizon; `execute == size` is open loop) and, between queries, the queue
supplies the next action. Where chunks overlap (execute < size) a newer one either replaces the
queue (`ensemble` null) or is blended in by ACT's temporal ensembling: the action for a tick is the
weighted mean of every prediction made for it, weight exp(-ensemble * i) with i = 0 the oldest
(Zhao et al. 2023, sec. 3.3), normalized over the predictions present.

The same queue runs in training, evaluation, the transfer gate and the ROS 2 node, on numpy
arrays or torch tensors (`xp` is the array module), so what the robot executes is what the critic
was trained on. The bundle carries the spec (`schema.chunk_from_metadata` range-checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAX_CHUNK = 256
"""Largest chunk a bundle may declare: a queue is size x action_dim numbers per env."""
MAX_ENSEMBLE = 1.0
"""|ensemble| bound: exp(-k * i) over a chunk stays far from float overflow and underflow."""


@dataclass(frozen=True)
class ChunkSpec:
    size: int = 1
    """Actions per policy query (h)."""
    execute: int = 1
    """Ticks between queries: `size` is open loop, fewer replan (receding horizon)."""
    ensemble: float | None = None
    """ACT's temporal-ensembling coefficient k; null replaces the queue with each new chunk."""

    def problems(self) -> list[tuple[str, str]]:
        """(field, what is expected) for every rule this spec breaks."""
        found = []
        if not (isinstance(self.size, int) and 1 <= self.size <= MAX_CHUNK):
            found.append(("size", f"an integer in [1, {MAX_CHUNK}]"))
        elif not (isinstance(self.execute, int) and 1 <= self.execute <= self.size):
            found.append(("execute", f"an integer in [1, size={self.size}]"))
        ensemble = self.ensemble
        if ensemble is not None and not (
            isinstance(ensemble, int | float) and math.isfinite(ensemble) and abs(ensemble) <= MAX_ENSEMBLE
        ):
            found.append(("ensemble", f"null or a number in [-{MAX_ENSEMBLE}, {MAX_ENSEMBLE}]"))
        return found

    def metadata(self, control_period: float) -> dict[str, Any]:
        return {"size": self.size, "execute": self.execute, "ensemble": self.ensemble, "dt": control_period}


class ChunkQueue:
    """Per env, the actions still to come from the chunks predicted so far.

    `pending[:, i]` accumulates the weighted predictions for the tick i steps ahead, `weight[:, i]`
    their weights and `count[:, i]` how many there are; each tick shifts all three by one.
    """

    def __init__(self, spec: ChunkSpec, num_envs: int, action_dim: int, xp: Any, **like: Any):
        self.spec, self.xp = spec, xp
        self.pending = xp.zeros((num_envs, spec.size, action_dim), **like)
        self.weight = xp.zeros((num_envs, spec.size), **like)
        self.count = xp.zeros((num_envs, spec.size), **like)
        self.age = xp.zeros((num_envs,), **like)
        """Ticks since each env's last query; `spec.execute` (or an empty queue) makes it due."""

    def due(self) -> Any:
        """Which envs query the policy on this tick."""
        return (self.age >= self.spec.execute) | (self.weight[:, 0] == 0)

    def act(self, chunk: Any | None) -> Any:
        """This tick's action per env, (N, action_dim). `chunk` (N, size, action_dim) is the policy's
        prediction from this tick's observation; it is taken only where `due()`, so a caller may pass
        None when no env is due (the robot queries only then)."""
        xp, due = self.xp, self.due()
        if chunk is not None:
            if self.spec.ensemble is None:
                self.pending = xp.where(due[:, None, None], chunk, self.pending)
                self.weight = xp.where(due[:, None], 1.0, self.weight)
            else:
                w = xp.where(due[:, None], xp.exp(-self.spec.ensemble * self.count), 0.0)
                # Selected, not multiplied by a zero weight: a NaN in a chunk not due must not reach the queue.
                self.pending = self.pending + xp.where(due[:, None, None], w[:, :, None] * chunk, 0.0)
                self.weight = self.weight + w
                self.count = self.count + xp.where(due[:, None], 1.0, 0.0)
            self.age = xp.where(due, 0.0, self.age)
        action = self.pending[:, 0] / xp.where(self.weight[:, :1] > 0, self.weight[:, :1], 1.0)
        self.pending = xp.roll(self.pending, -1, 1)
        self.weight, self.count = xp.roll(self.weight, -1, 1), xp.roll(self.count, -1, 1)
        self.pending[:, -1] = 0.0
        self.weight[:, -1] = 0.0
        self.count[:, -1] = 0.0
        self.age = self.age + 1
        return action

    def state_dict(self) -> dict[str, Any]:
        return {"pending": self.pending, "weight": self.weight, "count": self.count, "age": self.age}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending, self.weight, self.count, self.age = (state[k] for k in ("pending", "weight", "count", "age"))

    def clear(self, done: Any) -> None:
        """Empty the queues of envs whose episode ended (or whose robot left the policy's control)."""
        keep = self.xp.where(done, 0.0, 1.0)
        self.pending = self.pending * keep[:, None, None]
        self.weight, self.count = self.weight * keep[:, None], self.count * keep[:, None]
