"""The operator's requests to the node (e-stop, reset, start), queued in arrival order from any
thread and applied at the next tick, where an e-stop wins.

An e-stop received since the last tick wins over every reset, start or mode request of that tick:
a reset clears only an e-stop of an earlier tick (one sent after the operator could have seen the
stop), and a start in a reset's tick waits for the next one, so no request that raced an e-stop can
undo it. An e-stop also wakes the tick loop, so the stop is applied at once.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Literal

from q2real.safety.compiled import Shield
from q2real.safety.flags import Mode

Kind = Literal["estop", "reset", "start"]


@dataclass(frozen=True)
class Applied:
    """What a tick's requests did."""

    start: bool = False
    """A start is to be tried this tick."""
    estopped: bool = False
    """An e-stop latched: autostart and a pending handover are cancelled."""
    reset: bool = False
    """A reset was applied: a pending handover is cancelled."""
    dropped: tuple[str, ...] = ()
    """Why starts of this tick were not tried (an e-stop in the same tick, a reset after them): an operator
    who pressed start is told, never left guessing."""


class OperatorRequests:
    """The queue; `wake` is set with every e-stop, and `estop` stays set until a tick takes it."""

    def __init__(self, wake: threading.Event):
        self._wake = wake
        self.estop = threading.Event()
        self._lock = threading.Lock()
        self._queue: list[tuple[Kind, float, str]] = []
        """(kind, time.monotonic() at receipt, reason) since the last tick, in arrival order."""
        self.latched_at = -math.inf
        """time.monotonic() when ESTOP last latched; a reset received before it cannot clear it."""

    def push(self, kind: Kind, reason: str = "") -> None:
        with self._lock:
            self._queue.append((kind, time.monotonic(), reason))
            if kind == "estop":  # under the lock: the tick that takes the request also clears the event
                self.estop.set()
                self._wake.set()

    def apply(self, shield: Shield) -> Applied:
        """Apply the requests received since the last tick to `shield`."""
        with self._lock:
            requests, self._queue = self._queue, []
            self.estop.clear()
        if not requests:
            return Applied()
        estops = [reason for kind, _, reason in requests if kind == "estop"]
        if estops:
            if shield.mode != Mode.ESTOP:
                self.latched_at = time.monotonic()
            shield.estop(estops[0])
            started = any(kind == "start" for kind, _, _ in requests)
            dropped = ("start: an e-stop came with it; reset, then start again",) if started else ()
            return Applied(estopped=True, dropped=dropped)
        start = left_estop = reset = False
        dropped: tuple[str, ...] = ()
        for kind, received, reason in requests:
            if kind == "reset":
                if received > self.latched_at:  # sent after the operator could have seen the stop
                    left_estop |= shield.mode == Mode.ESTOP
                    shield.reset()
                if start:
                    dropped = ("start: a reset received after it cancelled it; start again",)
                start, reset = False, True
            elif left_estop:
                # Out of ESTOP for one tick first: a start in the reset's tick is tried at the next.
                with self._lock:
                    self._queue.insert(0, (kind, received, reason))
            else:
                start, dropped = True, ()
        return Applied(start=start, reset=reset, dropped=dropped)
