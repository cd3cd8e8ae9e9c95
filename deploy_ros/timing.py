"""Where each tick's time went: a preallocated ring of per-stage timestamps, written by the tick.

A late command on a robot is a scheduling question as often as a compute one, so every tick stamps
each stage of its path (all `time.monotonic()`, the clock every process on the machine shares):

  arrived    the joint state reached the node (NaN for a tick without a new state)
  began      the tick started: arrived -> began is the handoff to the ticking thread
  observed   the observation was built
  decided    the policy returned
  shielded   the shield produced the command
  published  the command was handed to the middleware

The ring is numpy memory allocated once, so recording costs a few stores per tick and no
allocation; readers (diagnostics, the exit summary, `q2real deploy --timings`) copy it off the
control path. Only rows the tick has finished are visible: `count` moves after the last store.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

STAGES = ("arrived", "began", "observed", "decided", "shielded", "published")
SPANS = {
    "handoff": ("arrived", "began"),
    "observation": ("began", "observed"),
    "policy": ("observed", "decided"),
    "shield": ("decided", "shielded"),
    "publish": ("shielded", "published"),
    "total": ("arrived", "published"),
}
"""Named durations between stages; `total` is the node's arrival-to-command latency."""
COLUMN = {stage: i for i, stage in enumerate(STAGES)}


class TickTimes:
    """The last `capacity` ticks' stage timestamps."""

    def __init__(self, capacity: int = 1 << 16):
        self.rows = np.full((capacity, len(STAGES)), np.nan)
        self.count = 0
        """Ticks finished so far (all time); row `count % capacity` is the one being written."""
        self._row = self.rows[0]

    def begin(self, arrived: float, began: float) -> None:
        row = self._row = self.rows[self.count % len(self.rows)]
        row[0] = arrived
        row[1] = began
        row[2] = row[3] = row[4] = row[5] = math.nan

    def stamp(self, stage: int, at: float) -> None:
        self._row[stage] = at

    def finish(self, published: float) -> None:
        self._row[5] = published
        self.count += 1

    def recent(self, last: int | None = None) -> np.ndarray:
        """The last `last` finished rows (all the ring holds if None), oldest first, as a copy."""
        count, capacity = self.count, len(self.rows)
        n = min(count, capacity, capacity if last is None else last)
        index = np.arange(count - n, count) % capacity
        return self.rows[index]

    def spans(self, last: int | None = None) -> dict[str, np.ndarray]:
        """Seconds per named span for each of the last rows (NaN where a stage did not happen)."""
        rows = self.recent(last)
        return {name: rows[:, COLUMN[b]] - rows[:, COLUMN[a]] for name, (a, b) in SPANS.items()}

    def summary(self, last: int | None = None) -> dict[str, dict[str, float]]:
        """p50, p99 and max in milliseconds per span over the last rows, where the span happened (ticks
        with a new joint state for `handoff` and `total`, ticks that ran the policy for `policy`).
        Sort-based, so a diagnostics report over 1000 ticks holds the GIL for microseconds, not the
        half millisecond np.percentile needs for six spans."""
        out: dict[str, dict[str, float]] = {}
        for name, values in self.spans(last).items():
            values = np.sort(values[np.isfinite(values)]) * 1e3
            if values.size:
                out[name] = {
                    "p50_ms": _quantile(values, 0.5),
                    "p99_ms": _quantile(values, 0.99),
                    "max_ms": float(values[-1]),
                }
            else:
                out[name] = {"p50_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan}
        return out

    def write_csv(self, path: str | Path) -> Path:
        """Every finished row in the ring as CSV, one column per stage (monotonic seconds)."""
        path = Path(path)
        np.savetxt(path, self.recent(), delimiter=",", header=",".join(STAGES), comments="", fmt="%.9f")
        return path


def _quantile(ordered: np.ndarray, q: float) -> float:
    """Linear-interpolated quantile of sorted values (numpy's default method)."""
    position = q * (ordered.size - 1)
    low = int(position)
    high = min(low + 1, ordered.size - 1)
    return float(ordered[low] + (position - low) * (ordered[high] - ordered[low]))
