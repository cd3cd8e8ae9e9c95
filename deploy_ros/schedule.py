"""When the node ticks: on a fresh joint state's arrival, or on the period's timer.

While states arrive about once a period (`trigger: state`), each tick runs on arrival in the thread
that delivered the state, so no thread handoff stands between a state and its command, and the
loop thread only keeps time: it ticks when a period's slot passes without a state (`LATE` after it
was due, when the next slot opens), at once on an e-stop, and collects garbage in the gap after each
tick. The slots follow the state stream's phase (`PHASE_GAIN`), so one delayed state neither costs
its own answer nor holds back the next. Otherwise (`trigger: timer`, or a robot much faster than the
policy) it ticks on the timer. Either way one lock holds a tick and its publishing, so a tick on
arrival and one on the timer never overlap and a policy swap lands between two ticks.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from q2real.deploy_ros.realtime import Collector

if TYPE_CHECKING:
    from q2real.deploy_ros.node import PolicyNode, Tick

Publish = Callable[["Tick"], None]
WINDOW = 0.25
"""A period's window opens this fraction of a period before the tick is due; a state that arrives
in it is ticked on at once."""


LATE = 1.0 - WINDOW
"""How far past its due time (in periods) a slot waits for its state before the timer ticks without
one: until the next slot's window opens, so a slot spans a whole period and a state the wire delayed
by less is answered when it comes. A stale tick earlier in the slot would only repeat the last state
and leave the late one waiting for the next window, lost to a robot that expects its answer within
the period."""
PHASE_GAIN = 0.25
"""How much of a state's lateness (or earliness) moves the next tick's due time; a state that came over
half a period before its slot opened (the stream's phase is elsewhere, as at the start) moves it all."""


class TickLoop:
    """The node's clock. `wake` ends any wait early (an e-stop, a tick on arrival); `estop` is the
    operator requests' pending e-stop, which is ticked on at once."""

    def __init__(self, node: PolicyNode, wake: threading.Event, estop: threading.Event, collect_between_ticks: bool):
        self.node = node
        self.lock = threading.Lock()
        """Held for a tick and its publishing."""
        self.wake, self.estop = wake, estop
        self.collector = Collector(collect_between_ticks)
        self.next_at = math.inf
        """time.monotonic() the next tick is due; its window opens `WINDOW` periods earlier."""
        self.misses = 0
        """Ticks taken more than half a period after they were due."""
        self._publish: Publish | None = None
        """Set while `spin` runs: a state arriving then is ticked on in the thread that delivered it."""

    def on_arrival(self) -> None:
        """A fresh joint state was stored: tick on it now if its period's window is open."""
        publish = self._publish
        if publish is not None and self.ticks_on_arrival():
            self.take(publish, arrival=True)

    def ticks_on_arrival(self) -> bool:
        # A robot much faster than the policy always has a fresh state: plain timer ticks then.
        node = self.node
        return node.config.trigger == "state" and node.states.period > 0.6 * node.period

    def spin(self, stop: threading.Event, publish: Publish) -> None:
        """Tick until `stop` is set, calling `publish(tick)` after each tick."""
        node, period = self.node, self.node.period
        slack = WINDOW * period
        self.collector.start()
        with self.lock:
            self.next_at = time.monotonic() + period
            self._publish = publish
        try:
            while not stop.is_set():
                with self.lock:  # a tick on arrival sets the wake-up under this lock: none is lost
                    self.wake.clear()
                    ticks, due = node.ticks, self.next_at
                on_arrival = self.ticks_on_arrival()
                deadline = due + LATE * period if on_arrival else due
                self._wait_until(due - slack if on_arrival else due)
                if node.ticks == ticks and on_arrival and not self.estop.is_set():
                    # The window is open: a state that came early is used now, else the first to come.
                    if not self.take(publish, expected=ticks, fresh_only=True):
                        self._wait_until(deadline)
                # The fallback tick: only for an e-stop or once the slot's deadline has really passed.
                if node.ticks == ticks and (self.estop.is_set() or time.monotonic() >= deadline):
                    self.take(publish, expected=ticks)
                self.collector.between_ticks()
        finally:
            with self.lock:
                self._publish = None
            self.collector.stop()

    def take(
        self, publish: Publish, arrival: bool = False, expected: int | None = None, fresh_only: bool = False
    ) -> bool:
        """Tick and publish unless this period's tick was already taken; True if it ticked.

        `arrival`: for a state just delivered, which ticks once its period's window has opened and
        never waits for the lock (the loop is ticking; the state is used by the next tick).
        `expected`: the tick count the loop saw before waiting; any tick since took the slot.
        """
        if not self.lock.acquire(blocking=not arrival):
            return False
        try:
            node = self.node
            now = time.monotonic()
            period = node.period
            states = node.states
            sample, fresh = states.latest, states.fresh
            if arrival and not (fresh and now >= self.next_at - WINDOW * period and self._publish is publish):
                return False  # not due yet, or `spin` has ended: nothing may be published any more
            if (expected is not None and node.ticks != expected) or (fresh_only and not fresh):
                return False
            if now > self.next_at + 0.5 * period:
                self.misses += 1
            node.write(publish, node.update(node.read(now)))
            due = self.next_at
            self.next_at = due + period
            if fresh and sample is not None and self.ticks_on_arrival():
                # Lock onto the state stream's phase, not onto its last state: a state the wire delayed
                # moves the schedule by a quarter of its delay, so the next state, on time, still finds
                # its window open instead of waiting for it (a state over half a period early, the phase
                # elsewhere as at the start, is followed at once).
                error = sample.received - due
                self.next_at += error if error < -0.5 * period else PHASE_GAIN * error
            if self.next_at + WINDOW * period < time.monotonic():
                self.next_at = time.monotonic() + period  # overran: skip the lost slots, do not burst
            if arrival:
                self.wake.set()  # the loop re-arms for the next slot
        finally:
            self.lock.release()
        return True

    def _wait_until(self, deadline: float) -> None:
        """Sleep until `deadline`, or less: an e-stop or a tick on arrival ends the wait."""
        remaining = deadline - time.monotonic()
        if remaining > 0 and not self.estop.is_set():
            self.wake.wait(remaining)
