"""`q2real operator`: start, stop, reset or e-stop a running q2real node from another terminal or machine,
over DDS with no ROS install, answered as the rclpy node's Trigger services answer (`PolicyNode.operate`):
`mode RAMP: ...` when the request was carried out, `mode ESTOP: start: ...` with the reason when not.

The request goes out on the node's own topic (`~/start`, `~/stop`, `~/reset`: std_msgs/Empty; `~/estop`:
std_msgs/Bool true), and only once the node's reader has matched and one of its reports has arrived, so it
is never written into a network where nobody hears it, nor before the answer can be heard. The answer is
read from `/diagnostics`: the node reports at once when a tick changes the mode or refuses a start, and
every `diagnostics_period` otherwise; a request that changed nothing (a reset while the policy runs) is
judged once the node has reported two more ticks, as `operate` judges it.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass
from typing import Literal

from q2real.configs.errors import Q2RealError
from q2real.deploy_ros.settings import NODE_NAME, resolve_topic
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import Endpoints, domain_id, use_loopback
from q2real.deploy_ros.watch.monitor import STATUS, status_line

Request = Literal["start", "stop", "reset", "estop"]
DONE: dict[str, tuple[str, ...]] = {
    "start": ("RAMP", "RUN"),
    "stop": ("ESTOP",),
    "estop": ("ESTOP",),
    "reset": ("PASSIVE",),
}
"""The modes in which each request counts as carried out (`PolicyNode.operate`)."""


class NoNode(Q2RealError):
    """No node read the request's topic, or none reported on the diagnostics topic, within the timeout."""


@dataclass(frozen=True)
class Answer:
    done: bool
    """Whether the node carried the request out (the mode it reached is one of `DONE`'s)."""
    text: str
    """`mode <MODE>`, with the node's reason when it gave one; or why no answer came."""


class Reports:
    """The q2real reports arriving on a diagnostics topic, in order, each with its `time.monotonic()`
    arrival; reports of other nodes on the topic are skipped."""

    def __init__(self, endpoints: Endpoints, topic: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        endpoints.reader(topic, msg.DiagnosticArray, self._on_message)

    def _on_message(self, message: msg.DiagnosticArray) -> None:
        for status in message.status:
            if status.name == STATUS:
                self._queue.put((status, time.monotonic()))

    def next(self, deadline: float) -> tuple[msg.DiagnosticStatus, float] | None:
        """The next report, or None when none came before `deadline` (`time.monotonic()`)."""
        try:
            return self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None


def status(timeout: float = 5.0, topic: str = "/diagnostics", loopback: bool = False) -> str:
    """The next report on `topic` as one console line (`q2real.deploy_ros.watch.monitor.status_line`)."""
    endpoints = _endpoints(loopback)
    try:
        report = Reports(endpoints, topic).next(time.monotonic() + timeout)
    finally:
        endpoints.close()
    if report is None:
        raise NoNode(
            f"no q2real node reported on {topic} within {timeout:g} s (DDS domain {domain_id()}): is one running "
            f"on this domain and network?{_loopback_hint(loopback)}"
        )
    return status_line(report[0], time.time())


def operate(
    request: Request, node: str = NODE_NAME, timeout: float = 5.0, topic: str = "/diagnostics", loopback: bool = False
) -> Answer:
    """Send `request` to the node named `node` and wait up to `timeout` s in all for it to be heard and
    answered; raises `NoNode` when no such node is on the domain."""
    target = resolve_topic(f"~/{request}", node)
    endpoints = _endpoints(loopback)
    try:
        deadline = time.monotonic() + timeout
        reports = Reports(endpoints, topic)
        writer = endpoints.writer(target, msg.Bool if request == "estop" else msg.Empty)
        while not writer.get_matched_subscriptions():
            if time.monotonic() > deadline:
                raise NoNode(
                    f"no node reads {target} on DDS domain {domain_id()} within {timeout:g} s: is a q2real node "
                    f"named {node} running on this domain and network?{_loopback_hint(loopback)}"
                )
            time.sleep(0.01)
        before = reports.next(deadline)
        if before is None:
            raise NoNode(
                f"{target} has a reader on DDS domain {domain_id()}, but no q2real node reported on {topic} "
                f"within {timeout:g} s: is it a q2real node, reporting on {topic}?"
            )
        sent = time.monotonic()
        writer.write(msg.Bool(data=True) if request == "estop" else msg.Empty())
        return _answer(request, reports, deadline, before[0], sent, timeout)
    finally:
        endpoints.close()


def _loopback_hint(loopback: bool) -> str:
    return "" if loopback else " (`--loopback` for a `deploy --sim` run)"


def _endpoints(loopback: bool) -> Endpoints:
    if loopback:
        use_loopback()
    return Endpoints(node="q2real_operator")


def _answer(
    request: Request,
    reports: Reports,
    deadline: float,
    before: msg.DiagnosticStatus,
    sent: float,
    timeout: float,
) -> Answer:
    """Judge the reports after `sent`: the mode reached, a start refused, or nothing changed after two
    ticks. `before`: the newest report from before the request (its refusal count is the baseline)."""
    refused_before = int(_values(before).get("refused_messages", "0"))
    first_ticks: int | None = None
    last: tuple[str, int] | None = None
    seen = 0
    while (report := reports.next(deadline)) is not None:
        status, received = report
        values = _values(status)
        if received < sent:  # written before the request: a newer baseline
            refused_before = int(values.get("refused_messages", "0"))
            continue
        mode, _, reason = status.message.partition(": ")
        if mode in DONE[request]:
            return Answer(True, f"mode {status.message}")
        if request == "start":
            refusal = values.get("last_refusal", "")
            if reason.startswith("start:"):
                return Answer(False, f"mode {status.message}")
            if int(values.get("refused_messages", "0")) > refused_before and refusal.startswith("start:"):
                return Answer(False, f"mode {mode}: {refusal}")
        ticks = int(values.get("ticks", "0"))
        if first_ticks is None:
            first_ticks = ticks
        elif ticks >= first_ticks + 2:  # a tick under way at the first report may have predated the request
            why = values.get("waiting_for_controller") or values.get("waiting_for_inputs") or reason
            return Answer(False, f"mode {mode}" + (f": {why}" if why else ""))
        last, seen = (mode, ticks), seen + 1
    if last is None:
        return Answer(False, f"no answer within {timeout:g} s: the node stopped reporting after the request")
    mode, ticks = last
    stalled = ": the node is not ticking; is the robot publishing joint states?" if seen > 1 else ""
    return Answer(False, f"no answer within {timeout:g} s (mode {mode}, ticks {ticks}){stalled}")


def _values(status: msg.DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}
