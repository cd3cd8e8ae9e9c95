"""torch's CPU thread count, chosen while training: as many threads as cores, or one.

On two cores a 256x256 SAC update runs about 1.3x faster on two threads than on one when the machine
is quiet, but beside one busy process every parallel region waits for a descheduled worker and the
same run is about 5x slower, while one thread barely notices. Which count wins depends on what else
runs (a deploy node, a streaming learner, another job), so the loop times short stretches at each
count and keeps the faster, re-checking the other with exponential backoff, and at once when the
current count suddenly slows down (a neighbour started). Timing uses only the host clock.
"""

from __future__ import annotations

import time
from collections import Counter

import torch

SWITCH_GAIN = 1.1
"""A probed count must be this much faster to take over (hysteresis against timing noise)."""
SLOWDOWN = 0.6
"""Two stretches in a row this much slower than the best seen at the current count trigger a probe at
once (one alone is more likely a checkpoint or a plot than a neighbour)."""


class ThreadTuner:
    """Between `many` threads and one; call `step()` once per loop iteration, it sets
    `torch.set_num_threads` as it goes. Stretches and probes are counted in loop iterations."""

    def __init__(self, many: int, stretch: int = 30, probe: int = 5, max_gap: int = 256):
        if many < 2:
            raise ValueError(f"ThreadTuner: expected at least 2 threads to choose from, got {many}")
        self.counts = (many, 1)
        self.stretch, self.probe, self.max_gap = stretch, probe, max_gap
        self.current = many
        self._last_rate = 0.0
        self._slow_stretches = 0
        self.iterations: Counter[int] = Counter()
        """Loop iterations run at each count (what the run mostly used)."""
        self._best: dict[int, float] = {}
        self._probing: int | None = None
        self._gap = self._until_probe = 1
        self._count, self._started = 0, time.perf_counter()
        torch.set_num_threads(self.current)

    def step(self) -> None:
        self._count += 1
        running = self._probing if self._probing is not None else self.current
        self.iterations[running] += 1
        if self._count < (self.probe if self._probing is not None else self.stretch):
            return
        rate = self._count / max(time.perf_counter() - self._started, 1e-9)
        if self._probing is not None:
            self._finish_probe(self._probing, rate)
        else:
            slow = rate < SLOWDOWN * self._best.get(self.current, 0.0)
            self._slow_stretches = self._slow_stretches + 1 if slow else 0
            self._best[self.current] = max(rate, self._best.get(self.current, 0.0))
            self._last_rate = rate
            self._until_probe -= 1
            if self._until_probe <= 0 or self._slow_stretches >= 2:
                self._slow_stretches = 0
                self._probing = self.counts[1] if self.current == self.counts[0] else self.counts[0]
                torch.set_num_threads(self._probing)
        self._count, self._started = 0, time.perf_counter()

    def _finish_probe(self, probed: int, rate: float) -> None:
        if rate > SWITCH_GAIN * self._last_rate:
            self.current, self._gap = probed, 1
            self._best[probed] = max(rate, self._best.get(probed, 0.0))
        else:
            self._gap = min(2 * self._gap, self.max_gap)
        self._probing = None
        self._until_probe = self._gap
        torch.set_num_threads(self.current)

    def summary(self) -> dict[str, object]:
        """For meta.json: the candidates, the count used most and iterations per count."""
        used = self.iterations.most_common(1)
        return {
            "policy": "auto",
            "candidates": list(self.counts),
            "chosen": used[0][0] if used else self.current,
            "iterations": {str(k): v for k, v in sorted(self.iterations.items())},
        }
