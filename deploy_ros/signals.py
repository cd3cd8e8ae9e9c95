"""Stop signals handled without locks in the handler.

Python runs a signal handler in the main thread between two bytecodes, possibly in the middle of
`Event.set()` or `Event.wait()` on the very event the handler sets. The event's lock is not
reentrant, so a handler that called `event.set()` there waited for itself: a second SIGTERM or an
impatient second Ctrl-C froze the node, the sim robot or the link for good. The handler here only
starts a thread that does the work, which gets the lock once the interrupted code has let it go.
"""

from __future__ import annotations

import _thread
import signal
from collections.abc import Callable


def on_signal(signum: int, action: Callable[[], object]) -> signal._HANDLER:
    """Run `action` on a thread of its own at each `signum`; returns the previous handler."""

    def handler(_signum, _frame) -> None:
        _thread.start_new_thread(action, ())

    return signal.signal(signum, handler)
