"""Progress reporting: a tqdm bar with steps/s and ETA on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, description: str, stream=None, plain_interval_s: float = 10.0, unit: str = "step"):
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
        steps = max(0, min(steps, self.total - self.done))
        self.done += steps
        if postfix:
            self._postfix = "  ".join(f"{k}={v:.4g}" for k, v in postfix.items())
        if self._bar is not None:
            self._bar.update(steps)
            if postfix:
                self._bar.set_postfix_str(self._postfix, refresh=False)
            return
        now = time.monotonic()
        if now - self._last_print >= self._interval or self.done >= self.total:
            self._last_print = now
            rate = self.done / max(now - self._start, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            print(
                f"{self._description}: {self.done}/{self.total} {self._unit}s ({100 * self.done / self.total:.0f}%)  "
                f"{rate:,.0f} {self._unit}s/s  ETA {eta:,.0f} s  {self._postfix}",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
