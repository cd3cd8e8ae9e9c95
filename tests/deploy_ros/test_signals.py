"""A stop signal may land while the main thread is inside `Event.set()` or `Event.wait()` of the very
event its handler sets (a second SIGTERM, a second Ctrl-C): the handler must not wait for a lock the
interrupted code holds."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from q2real.deploy_ros.signals import on_signal


@pytest.mark.timeout(30)
def test_a_signal_landing_inside_the_events_own_lock_still_sets_it_once_the_lock_is_free() -> None:
    stop = threading.Event()
    previous = on_signal(signal.SIGUSR1, stop.set)
    try:
        with stop._cond:  # the lock Event.set() and Event.wait() hold, where a second signal lands
            os.kill(os.getpid(), signal.SIGUSR1)
            handled = sum(range(1000))  # the handler runs here, between two bytecodes of this thread
            assert handled and not stop.is_set()
        assert stop.wait(5)
    finally:
        signal.signal(signal.SIGUSR1, previous)
