"""`q2real monitor`: follow any q2real node's `/diagnostics` from another terminal or machine, over
DDS, with no ROS install: one line per report, as the node's own console prints it.

The node reports at `diagnostics_period` and at once on every mode change, so the monitor sees an
e-stop or a fallback as it happens. Reports of other nodes on the topic (not a q2real shield) are
skipped.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from q2real.deploy_ros.figures import figures_line
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import Endpoints, use_loopback

STATUS = "q2real_policy: shield"
"""The status name the node reports under (`q2real.deploy_ros.transport.commands.diagnostics_message`)."""
LEVELS = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}


def status_line(status, received: float) -> str:
    """One report as a console line: level, mode, robot, the figures an operator watches, and why."""
    values = {kv.key: kv.value for kv in status.values}
    level = LEVELS.get(int(status.level), "?")
    line = (
        f"{time.strftime('%H:%M:%S', time.localtime(received))}  {status.hardware_id}  {level:<5} "
        f"mode {status.message:<7} ticks {values.get('ticks', '?'):>7}  "
        f"latency p50 {values.get('latency_p50_ms', '?')} p99 {values.get('latency_p99_ms', '?')} ms  "
        f"loop misses {values.get('loop_deadline_misses', '?')}  "
        f"refused {values.get('refused_messages', '?')}  flags {values.get('flags', '-')}"
    )
    figures = figures_line(values)
    if figures:
        line += f"\n    figures: {figures}"
    for key in ("waiting_for_controller", "waiting_for_inputs", "last_refusal", "robot_mismatch"):
        if values.get(key):
            line += f"\n    {key}: {values[key]}"
    return line


def monitor(
    topic: str = "/diagnostics",
    duration: float | None = None,
    count: int | None = None,
    loopback: bool = False,
    out: Callable[[str], None] = print,
) -> int:
    """Print each q2real report on `topic` until `duration` s, `count` reports, or Ctrl-C; returns
    how many were printed."""
    if loopback:
        use_loopback()
    reports: queue.SimpleQueue = queue.SimpleQueue()
    endpoints = Endpoints(node="q2real_monitor")
    stop = threading.Event()
    if duration is not None:
        timer = threading.Timer(duration, stop.set)
        timer.daemon = True
        timer.start()

    def on_message(message) -> None:
        for status in message.status:
            if status.name == STATUS:
                reports.put((status, time.time()))

    printed = 0
    try:
        endpoints.reader(topic, msg.DiagnosticArray, on_message)
        while not stop.is_set() and (count is None or printed < count):
            try:
                status, received = reports.get(timeout=0.2)
            except queue.Empty:
                continue
            out(status_line(status, received))
            printed += 1
    finally:
        endpoints.close()
    return printed
