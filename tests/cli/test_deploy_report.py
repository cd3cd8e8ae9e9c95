"""What `q2real deploy` prints: each mode change as it happens, the status line, and when it stops how the run
ended and what the policy and shield did."""

from __future__ import annotations

import time

from q2real.cli.main import _shield_report
from q2real.deploy_ros.session import ModeLines, Summary


def _summary(**fields) -> Summary:
    base = dict(
        ticks=800,
        mode="ESTOP",
        latency_p50_ms=0.5,
        latency_p99_ms=1.0,
        loop_deadline_misses=0,
        refused_messages=0,
        shield_counters={},
        run_ticks=781,
        run_interventions=0,
        run_change=0.0,
        stages={},
        realtime=[],
    )
    return Summary(**(base | fields))


def test_vetoes_are_reported_beside_the_clamps_with_the_critics_range() -> None:
    report = _shield_report(_summary(shield_counters={"VETO": 778}, policy_queries=781, cost_q_range=(-0.5, 2.25)))
    assert "ran on 781 of 781 ticks in RUN" in report
    assert "its clamps changed the policy's command on 0 of those ticks" in report
    assert "the cost critic vetoed 778 ticks (Q_c -0.5 to 2.25)" in report


def test_without_a_cost_critic_no_veto_is_mentioned() -> None:
    report = _shield_report(_summary(shield_counters={"POSITION_CLAMP": 3}, run_interventions=3, run_change=1.5))
    assert "POSITION_CLAMP" in report and "on 3 of those ticks" in report and "veto" not in report


def test_a_diagnostics_report_reads_as_one_console_line_with_what_holds_the_node_back() -> None:
    from q2real.deploy_ros.transport import messages as msg
    from q2real.deploy_ros.watch.monitor import status_line

    values = {"ticks": "1200", "latency_p50_ms": "0.500", "latency_p99_ms": "1.000", "loop_deadline_misses": "0"}
    values |= {"refused_messages": "2", "flags": "-", "waiting_for_inputs": "imu.stale"}
    status = msg.DiagnosticStatus(
        level=1, name="q2real_policy: shield", message="RAMP", hardware_id="spot",
        values=[msg.KeyValue(key=k, value=v) for k, v in values.items()],
    )  # fmt: skip
    line = status_line(status, 0.0)
    assert "spot  WARN  mode RAMP" in line and "ticks    1200" in line and "refused 2" in line
    assert line.endswith("\n    waiting_for_inputs: imu.stale")


def test_the_console_status_names_the_newest_refusal_once() -> None:
    """A refused message (a start, a task command) is said on the console, not only counted."""
    from types import SimpleNamespace

    from q2real.deploy_ros.session import _status_line

    values = {"mode": "PASSIVE", "ticks": "10", "latency_p50_ms": "0.5", "latency_p99_ms": "1.0"}
    values |= {"loop_deadline_misses": "0", "refused_messages": "1", "last_refusal": "start: the policy already runs"}
    node = SimpleNamespace(diagnostics=lambda: {"values": values})
    line, refused = _status_line(node)  # pyright: ignore[reportArgumentType]
    assert refused == 1 and line.endswith("refused 1\n  refused: start: the policy already runs")
    line, refused = _status_line(node, refused)  # pyright: ignore[reportArgumentType]
    assert refused == 1 and line.endswith("refused 1")


def test_the_console_says_each_mode_change_and_reason_once_and_nothing_for_a_quiet_report() -> None:
    """As the node reports it, not at the next status line: an operator sees a stop and its reason at once."""
    said: list[str] = []
    lines = ModeLines(said.append)
    for mode, message in [
        ("PASSIVE", "PASSIVE"),  # where every node starts
        ("RAMP", "RAMP: operator start: ramping from the measured pose to the default pose"),
        ("RAMP", "RAMP"),
        ("RUN", "RUN"),  # a change without a reason still gets its line
        ("RUN", "RUN"),
        ("ESTOP", "ESTOP: operator stop"),
    ]:
        lines({"message": message, "values": {"mode": mode}})
    assert [line.split("  ", 1)[1] for line in said] == [
        "mode RAMP: operator start: ramping from the measured pose to the default pose",
        "mode RUN",
        "mode ESTOP: operator stop",
    ]
    assert all(time.strptime(line.split("  ", 1)[0], "%H:%M:%S") for line in said)
