"""The robot's transitions, shared between the deploy node and its learner process through one file.

The node appends a row per tick (observation, the action the shield let through, joint positions
and velocities, flags, the policy version) into a memory-mapped ring: a few numpy stores and a
counter, no lock, no syscall, nothing the tick can wait on. The learner reads the rows it has not
seen; rows the node overwrote before the learner got to them (the learner fell more than the ring's
capacity behind) are counted as dropped, never half-read. The learner writes each row's reward back,
which the node reads off the tick to judge a policy version by its return.

One writer per column group (the node: rows and `head`; the learner: rewards and `rewarded`), and a
counter is stored only after what it counts: on every platform q2real runs on (x86-64 and arm64
Linux, both coherent for aligned 8-byte stores through a shared mapping) a reader that sees the
counter sees the rows. A row the writer is overwriting while the reader copies it is detected by
re-reading `head` after the copy, and dropped.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

MAGIC = 0x51325254  # "Q2RT"
HEADER = 8
"""int64 slots: magic, capacity, obs_dim, action_dim, joints, head, rewarded, spare."""
_HEAD, _REWARDED = 5, 6
RUN = 1
"""Row flag: the policy ran this tick (the shield in RUN); only such rows are transitions."""
CHANGED = 2
"""Row flag: one of the shield's clamps changed the policy's action."""


def row_dtype(obs_dim: int, action_dim: int, joints: int) -> np.dtype:
    return np.dtype(
        [
            ("tick", np.int64),
            ("obs", np.float32, (obs_dim,)),
            ("action", np.float32, (action_dim,)),
            ("wanted", np.float32, (action_dim,)),
            ("q", np.float64, (joints,)),
            ("qd", np.float64, (joints,)),
            ("version", np.int32),
            ("flags", np.uint8),
            ("reward_in", np.float32),
        ],
        align=True,
    )


class TransitionRing:
    """`create=True` (the node) makes the file; the learner opens it and learns the sizes from it."""

    def __init__(
        self,
        path: str | Path,
        capacity: int = 0,
        obs_dim: int = 0,
        action_dim: int = 0,
        joints: int = 0,
        create: bool = False,
    ):
        self.path = Path(path)
        if create:
            if capacity < 2 or min(obs_dim, action_dim, joints) < 1:
                raise ValueError(f"{self.path}: ring sizes must be positive (capacity >= 2)")
            layout = np.array([MAGIC, capacity, obs_dim, action_dim, joints, 0, 0, 0], dtype=np.int64)
            dtype = row_dtype(obs_dim, action_dim, joints)
            size = HEADER * 8 + capacity * (dtype.itemsize + 4)
            with open(self.path, "wb") as handle:
                handle.truncate(size)
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r+")
            self._map[: HEADER * 8] = layout.view(np.uint8)
        else:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r+")
        self.header = self._map[: HEADER * 8].view(np.int64)
        magic, capacity, obs_dim, action_dim, joints = (int(v) for v in self.header[:5])
        if magic != MAGIC:
            raise ValueError(f"{self.path}: not a q2real transition ring")
        self.capacity, self.obs_dim, self.action_dim, self.joints = capacity, obs_dim, action_dim, joints
        self.dtype = row_dtype(obs_dim, action_dim, joints)
        start = HEADER * 8
        end = start + capacity * self.dtype.itemsize
        self.rows = self._map[start:end].view(self.dtype)
        self.rewards = self._map[end : end + capacity * 4].view(np.float32)
        self.dropped = 0
        """Rows this reader never saw: overwritten before it read them."""

    # --- the node ----------------------------------------------------------------------------------
    @property
    def head(self) -> int:
        """Rows ever written."""
        return int(self.header[_HEAD])

    def append(
        self, tick: int, obs, action, q, qd, version: int, flags: int, reward_in: float = np.nan, wanted=None
    ) -> None:
        """`action`: what the shield let through, in action units; `wanted`: what the policy (with its
        exploration) asked for, before the shield (None: the same). `reward_in`: the reward received
        on the node's reward input since the tick before (NaN: none), the reward of the transition
        that ends at this row."""
        head = int(self.header[_HEAD])
        row = self.rows[head % self.capacity]
        row["tick"], row["obs"], row["action"], row["q"], row["qd"] = tick, obs, action, q, qd
        row["wanted"] = action if wanted is None else wanted
        row["version"], row["flags"], row["reward_in"] = version, flags, reward_in
        self.header[_HEAD] = head + 1

    def put(self, first: int, rows: np.ndarray) -> None:
        """The remote learner's mirror of the node's ring: rows [first, first + n) at the indices the
        node gave them. Rows the link lost before `first` are blanked (no flags, NaN reward) rather
        than left as an older lap's, which would pair into transitions that never happened."""
        head = int(self.header[_HEAD])
        if first < head or len(rows) > self.capacity:
            raise ValueError(f"{self.path}: rows from {first} (at most {self.capacity}) after row {head} expected")
        lost = np.arange(max(head, first + len(rows) - self.capacity), first) % self.capacity
        self.rows["tick"][lost], self.rows["flags"][lost], self.rewards[lost] = -1, 0, np.nan
        self.rows[np.arange(first, first + len(rows)) % self.capacity] = rows
        self.header[_HEAD] = first + len(rows)

    @property
    def rewarded(self) -> int:
        """Rows whose reward the learner has written."""
        return int(self.header[_REWARDED])

    def rewards_since(self, start: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Rewards the learner wrote for rows [start, rewarded) still in the ring, with each row's
        version; returns (rewards, versions, rewarded)."""
        rewarded = int(self.header[_REWARDED])
        start = max(start, rewarded - self.capacity, self.head - self.capacity)
        index = np.arange(start, rewarded) % self.capacity
        return self.rewards[index].copy(), self.rows["version"][index].copy(), rewarded

    # --- the learner -------------------------------------------------------------------------------
    def read(self, start: int, limit: int | None = None) -> tuple[np.ndarray, int]:
        """Rows [start, head) (at most `limit`) as a copy, and the index after the last one returned;
        rows overwritten before or while they were copied are skipped and counted in `dropped`."""
        head = int(self.header[_HEAD])
        first = max(start, head - self.capacity)
        last = head if limit is None else min(head, first + limit)
        rows = self.rows[np.arange(first, last) % self.capacity].copy()
        # Rows the node may have overwritten while they were copied: any below the new head - capacity.
        safe = max(first, int(self.header[_HEAD]) - self.capacity)
        self.dropped += safe - start
        return rows[safe - first :], max(last, safe)

    def write_rewards(self, start: int, rewards: np.ndarray) -> None:
        """Rewards of rows [start, start + len(rewards)), published up to their end."""
        index = np.arange(start, start + len(rewards)) % self.capacity
        self.rewards[index] = rewards
        self.header[_REWARDED] = start + len(rewards)

    def close(self) -> None:
        self._map.flush()
        del self.rows, self.rewards, self.header, self._map


# --- the version protocol: files in the fine-tuning directory, each written atomically ----------------
RING = "transitions.ring"
CANDIDATE = "candidate.json"
"""The learner's newest published policy: {"version", "bundle", "probe", "step"}."""
READY = "learner.ready"
"""The learner has loaded the run and reads the ring."""
ROLLBACK = "rollback.json"
"""The node's last rollback: {"version": the good version it runs again, "refused": the bad one}."""
GOOD = "good.json"
"""The version the node last judged good (accepted, or rolled back to): {"version"}. The learner keeps
its candidates near it (`FinetuneConfig.anchor`)."""


def write_atomic(path: Path, data: str | bytes) -> None:
    """A protocol file as a whole or not at all: the other side may read it at any moment."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def version_name(version: int) -> str:
    """File stem of a policy version: v0000 is the bundle deployed at the start."""
    return f"v{version:04d}"
