"""The node's /diagnostics, published from a thread of their own, never from a tick.

Building a report (percentiles, counters, strings) and writing a DiagnosticArray cost more than the
rest of a tick; on the control thread they would delay every tick they share. This thread reports
every `diagnostics_period`, and at once when a tick changed the mode or the shield gave a reason
(`PolicyNode.changed`), appending that reason to the message.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from q2real.deploy_ros.node import PolicyNode

Report = dict


class DiagnosticsThread:
    def __init__(self, node: PolicyNode, write: Callable[[Report], None]):
        self.node = node
        self.write = write
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="q2real-diagnostics", daemon=True)
        self._reported_reason = ""

    def start(self) -> DiagnosticsThread:
        self._thread.start()
        return self

    def report(self) -> Report:
        node = self.node
        report = node.diagnostics()
        reason = node.last_reason
        if reason and reason != self._reported_reason:
            report["message"] = f"{report['message']}: {reason}"
            self._reported_reason = reason
        return report

    def _run(self) -> None:
        node = self.node
        while not self._stop.is_set():
            node.changed.wait(node.config.diagnostics_period)
            node.changed.clear()
            if not self._stop.is_set():
                try:
                    self.write(self.report())
                except Exception as err:  # a report must never end reporting (a transport hiccup, a bug)
                    print(f"warning: diagnostics not published: {type(err).__name__}: {err}", file=sys.stderr)

    def stop(self) -> None:
        """Stop and join; the caller then writes a last report itself if it wants one."""
        self._stop.set()
        self.node.changed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)
