"""Progress reporting: a tqdm bar with steps/s and ETA on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    """`total` None: work that runs until it is stopped (a learner on a robot's stream), counted without
    a share or an ETA."""

    def __init__(
        self, total: int | None, description: str, stream=None, plain_interval_s: float = 10.0, unit: str = "step"
    ):
        self.stream = stream or sys.stderr
        self.total = total
        self.done = 0
        self._description = description
        self._start = self._last_print = time.monotonic()
        self._interval = plain_interval_s
        self._postfix = ""
        self._unit = unit
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._bar = tqdm(total=total, desc=description, unit=unit, unit_scale=True, file=self.stream) if tty else None

    def update(self, steps: int, **postfix: float) -> None:
        """Count `steps` more, never past the total (a batch of envs may finish more episodes at once
        than were left to record)."""
        steps = max(0, steps if self.total is None else min(steps, self.total - self.done))
        self.done += steps
        if postfix:
            self._postfix = "  ".join(f"{k}={v:.4g}" for k, v in postfix.items())
        if self._bar is not None:
            self._bar.update(steps)
            if postfix:
                self._bar.set_postfix_str(self._postfix, refresh=False)
            return
        now = time.monotonic()
        finished = self.total is not None and self.done >= self.total
        if now - self._last_print >= self._interval or finished:
            self._last_print = now
            rate = self.done / max(now - self._start, 1e-9)
            if self.total is None:
                count, eta = f"{self.done:,} {self._unit}s", ""
            else:
                left = (self.total - self.done) / rate if rate > 0 else float("inf")
                count = f"{self.done}/{self.total} {self._unit}s ({100 * self.done / self.total:.0f}%)"
                eta = f"  ETA {left:,.0f} s"
            print(
                f"{self._description}: {count}  {rate:,.0f} {self._unit}s/s{eta}  {self._postfix}".rstrip(),
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
