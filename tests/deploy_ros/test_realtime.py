"""The control loop keeps its deadline: ticks on arrival, nothing blocking on the tick path, garbage
collected between ticks, real-time settings applied or refused with the reason, and lost ticks
measured as the robot sees them."""

from __future__ import annotations

import builtins
import gc
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest

from q2real.configs.loader import ConfigError, load
from q2real.deploy_ros import realtime
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.settings import NodeConfig, RealtimeConfig
from q2real.deploy_ros.timing import COLUMN, TickTimes
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import SENSOR_QOS, DdsNode, wait_for_match
from q2real.deploy_ros.transport.diagnostics import DiagnosticsThread
from q2real.deploy_ros.watch.recorder import Recorder
from q2real.safety.flags import Mode
from q2real.safety.shield import ShieldConfig
from tests.deploy_ros.probe import busy_neighbour, match, probe

PERIOD = 0.02  # the pendulum's control period


def _config(**fields) -> NodeConfig:
    return NodeConfig(autostart=True, shield=ShieldConfig(ramp_time=0.05), **fields)


def _feed(node: PolicyNode, seconds: float, period: float = PERIOD) -> None:
    """Joint states at the robot's period, from this thread."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        node.on_joint_state(["hinge"], [0.01], [0.0], [])
        time.sleep(period)


def test_states_are_ticked_on_arrival_and_the_loop_ticks_when_they_stop(pendulum_bundle) -> None:
    node = PolicyNode(pendulum_bundle, _config(realtime=RealtimeConfig(gc="automatic")))
    ticks: list[tuple[int, bool]] = []  # (thread, had a new state)
    stop = threading.Event()
    loop = threading.Thread(
        target=node.spin, args=(stop, lambda t: ticks.append((threading.get_ident(), math.isfinite(t.latency))))
    )
    loop.start()
    try:
        _feed(node, 0.6)
        fed = len(ticks)
        time.sleep(0.2)  # the robot goes quiet: the timer takes over
    finally:
        stop.set()
        loop.join(5)
    here, there = threading.get_ident(), loop.ident
    fresh = [thread for thread, new in ticks[:fed] if new]
    assert len(fresh) > 15 and fresh.count(here) >= len(fresh) - 2, "fresh states were not ticked on arrival"
    quiet = [thread for thread, _ in ticks[fed:]]
    assert len(quiet) >= 5 and set(quiet) == {there}, "the loop did not tick on its timer without states"
    assert node.shield.mode in (Mode.RUN, Mode.HOLD, Mode.DAMP)
    spans = node.times.summary()
    assert spans["total"]["p50_ms"] > 0 and spans["policy"]["p50_ms"] > 0


@pytest.mark.slow  # DDS discovery and a second of 100 Hz traffic
def test_the_tick_path_does_no_blocking_io_and_reporting_runs_on_other_threads(
    pendulum_bundle, participant, tmp_path, monkeypatch
) -> None:
    # Earlier tests' garbage (an unclosed file's ResourceWarning goes to stderr) must not be collected
    # between this node's ticks, on its loop thread: that would be their output, not the node's.
    gc.collect()
    node = PolicyNode(pendulum_bundle, _config(diagnostics_period=0.05))
    transport = DdsNode(node)
    transport.recorder = Recorder(
        tmp_path / "bag", transport.command_topic, transport.command_type, {"x": 1}, inputs=transport.input_topics
    )
    # Thread objects, not idents: an ident is reused once its thread ends (an earlier test's reporter).
    tick_threads: set[threading.Thread] = set()
    calls: dict[str, set[threading.Thread]] = {}

    written: list[str] = []

    def watched(name, function):
        def wrapper(*args, **kwargs):
            calls.setdefault(name, set()).add(threading.current_thread())
            if name == "stderr":
                written.append(str(args[0])[:300])
            return function(*args, **kwargs)

        return wrapper

    publish = transport.publish

    def tick_publish(tick):
        tick_threads.add(threading.current_thread())
        publish(tick)

    monkeypatch.setattr(builtins, "open", watched("open", builtins.open))
    monkeypatch.setattr(os, "write", watched("os.write", os.write))
    monkeypatch.setattr(sys.stdout, "write", watched("stdout", sys.stdout.write))
    monkeypatch.setattr(sys.stderr, "write", watched("stderr", sys.stderr.write))
    monkeypatch.setattr(logging.Logger, "handle", watched("logging", logging.Logger.handle))
    monkeypatch.setattr(Recorder, "_record", watched("recording", Recorder._record))
    monkeypatch.setattr(DiagnosticsThread, "report", watched("diagnostics", DiagnosticsThread.report))
    endpoints = participant("robot")
    robot = endpoints.writer("/joint_states", msg.JointState, SENSOR_QOS)
    endpoints.reader(transport.command_topic, transport.command_type)  # the controller
    wait_for_match(robot)
    stop = threading.Event()
    loop = threading.Thread(target=node.spin, args=(stop, tick_publish))
    loop.start()
    try:
        for step in range(120):
            robot.write(msg.JointState(name=["hinge"], position=[0.01 * np.sin(step / 10)], velocity=[0.0], effort=[]))
            time.sleep(0.01)
    finally:
        stop.set()
        loop.join(5)
        transport.recorder.close()
        transport.close()
    assert node.ticks > 50 and node.shield.mode == Mode.RUN
    assert calls.get("recording") and calls.get("diagnostics"), f"recording or diagnostics never ran: {calls}"
    assert not transport.recorder.lost, transport.recorder.first_error
    overlap = {name: threads & tick_threads for name, threads in calls.items() if threads & tick_threads}
    assert not overlap, f"ran on a ticking thread: {sorted(overlap)} (stderr: {written})"
    assert threading.current_thread() not in tick_threads, "the robot's writer thread should not have ticked"


def test_a_mode_change_reaches_diagnostics_at_once_not_at_the_next_period(pendulum_bundle) -> None:
    node = PolicyNode(pendulum_bundle, _config(diagnostics_period=30.0))
    reports: list[tuple[float, dict]] = []
    thread = DiagnosticsThread(node, lambda r: reports.append((time.monotonic(), r))).start()
    try:
        node.on_joint_state(["hinge"], [0.0], [0.0], [])
        node.tick()
        time.sleep(0.1)
        assert not reports, "nothing changed, yet a report went out before its period"
        node.on_estop(True, "operator")
        changed = time.monotonic()
        node.tick()
        while not reports and time.monotonic() < changed + 2.0:
            time.sleep(0.005)
    finally:
        thread.stop()
    assert reports, "a mode change did not produce a report"
    at, report = reports[0]
    assert report["values"]["mode"] == "ESTOP" and "operator" in report["message"]
    assert at - changed < 0.5


def test_garbage_is_collected_between_ticks_only() -> None:
    collector = realtime.Collector(enabled=True)
    enabled = gc.isenabled()
    collector.start()
    try:
        assert not gc.isenabled() and gc.get_freeze_count() > 0

        class Cycle:
            pass

        cycle = Cycle()
        cycle.me = cycle  # type: ignore[attr-defined]
        ref = weakref.ref(cycle)
        del cycle
        young = [[] for _ in range(2 * gc.get_threshold()[0])]  # tracked objects: the young count grows
        assert ref() is not None, "collected although automatic collection is off"
        collector.between_ticks()
        assert ref() is None, "between_ticks did not collect a young cycle past the threshold"
        del young
    finally:
        collector.stop()
    assert gc.isenabled() == enabled and gc.get_freeze_count() == 0


def test_tick_times_ring_wraps_and_keeps_the_newest_rows(tmp_path) -> None:
    times = TickTimes(capacity=4)
    for i in range(6):
        times.begin(float(i), i + 0.1)
        for stage in (2, 3, 4):
            times.stamp(stage, i + 0.1 * stage)
        times.finish(i + 0.5)
    rows = times.recent()
    assert rows[:, 0].tolist() == [2.0, 3.0, 4.0, 5.0]
    assert times.recent(2)[:, 0].tolist() == [4.0, 5.0]
    assert np.allclose(times.spans()["total"], 0.5) and np.allclose(times.summary()["total"]["p99_ms"], 500.0)
    back = np.loadtxt(times.write_csv(tmp_path / "t.csv"), delimiter=",", skiprows=1)
    assert np.allclose(back, rows)


def test_probe_matches_each_state_to_its_first_command_within_the_window() -> None:
    period = 0.002
    sent = np.array([0.0, 0.002, 0.004, 0.006])
    # state 0: answered after 0.5 ms (and a duplicate); state 1: nothing; state 2: 1.95 ms is past
    # the 0.95 window (and arrives before state 3 was sent); state 3: 1 ms.
    arrivals = np.array([0.0005, 0.0007, 0.00595, 0.007])
    latency = match(sent, arrivals, period)
    assert np.allclose(latency[[0, 3]], [0.0005, 0.001])
    assert np.isinf(latency[[1, 2]]).all()


def test_realtime_settings_are_range_checked_naming_the_key(tmp_path) -> None:
    for override, key in [
        ("realtime.priority=100", "realtime.priority"),
        ("realtime.cpus=[0,0]", "realtime.cpus"),
        ("realtime.cpus=[-1]", "realtime.cpus[0]"),
        ("realtime.switch_interval=0", "realtime.switch_interval"),
        ("realtime.gc=sometimes", "realtime.gc"),
        ("realtime.turbo=true", "realtime.turbo"),
    ]:
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            load(NodeConfig, None, [override])


def test_cpus_this_process_may_not_use_are_refused() -> None:
    missing = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(realtime.RealtimeError, match=rf"realtime.cpus: CPUs \[{missing}\] are not available"):
        realtime.apply(RealtimeConfig(cpus=(missing,), switch_interval=sys.getswitchinterval()))


REFUSAL = textwrap.dedent(
    """
    import os, resource, sys
    from q2real.deploy_ros import realtime
    from q2real.deploy_ros.settings import RealtimeConfig
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    if os.getuid() == 0:
        os.setgid(65534)
        os.setuid(65534)  # nobody: no CAP_SYS_NICE or CAP_IPC_LOCK, so the limits above bind
    for config in (RealtimeConfig(priority=50), RealtimeConfig(lock_memory=True)):
        try:
            realtime.apply(config)
            print("applied", config)
        except realtime.RealtimeError as err:
            print("refused:", err)
    """
)


@pytest.mark.slow  # a child process
def test_real_time_settings_the_os_denies_stop_with_the_reason_and_the_fix() -> None:
    """A real refusal: a process without the privilege asks for SCHED_FIFO and locked memory."""
    out = subprocess.run([sys.executable, "-c", REFUSAL], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("refused:") for line in lines), out.stdout
    assert "realtime.priority=50: the OS refused SCHED_FIFO" in lines[0] and "limits.conf" in lines[0]
    assert "realtime.lock_memory: the OS refused mlockall" in lines[1] and "memlock" in lines[1]


GRANTED = textwrap.dedent(
    """
    import json, os, sys
    from q2real.deploy_ros import realtime
    from q2real.deploy_ros.settings import RealtimeConfig
    applied = realtime.apply(RealtimeConfig(cpus=(0,), priority=10, lock_memory=True))
    scheduler = "fifo" if os.sched_getscheduler(0) == os.SCHED_FIFO else "other"
    print(json.dumps([applied, scheduler, sorted(os.sched_getaffinity(0)), sys.getswitchinterval()]))
    """
)


@pytest.mark.slow  # a child process
def test_granted_real_time_settings_are_in_effect() -> None:
    probe_allowed = subprocess.run(
        [sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"],
        capture_output=True,
    )
    if probe_allowed.returncode != 0:
        pytest.skip("this user may not use SCHED_FIFO, so only the refusal can be tested here (test above)")
    out = subprocess.run([sys.executable, "-c", GRANTED], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    applied, scheduler, cpus, switch_interval = json.loads(out.stdout)
    assert applied == ["CPUs [0]", "SCHED_FIFO priority 10", "memory locked"]
    assert (scheduler, cpus, switch_interval) == ("fifo", [0], 0.0005)


@pytest.mark.slow  # the node as its own process, beside a busy one, for a few seconds
def test_beside_a_cpu_bound_process_a_100hz_loop_over_dds_answers_nearly_every_state(
    pendulum_bundle, dds_domain
) -> None:
    neighbour = busy_neighbour()
    overrides = ["control_period=0.01", "autostart=true", "shield.ramp_time=0.05", "startup_timeout=30"]
    node = subprocess.Popen(
        [sys.executable, "-m", "q2real.cli.main", "deploy", str(pendulum_bundle), "--duration", "30", *overrides],
        stdout=subprocess.DEVNULL,
    )
    try:
        result = probe(rate=100.0, seconds=4.0, warmup=2.0)
    finally:
        for child in (node, neighbour):
            child.terminate()
            child.wait(30)
    assert result.latency.size == 400
    assert result.lost_fraction < 0.05, result.row()


def test_no_two_ticks_share_a_period_however_the_states_jitter(pendulum_bundle) -> None:
    """Judged on the node's own schedule, not on gaps between ticks: a tick the machine delayed may
    be followed closely by the next slot's, which is not a second tick in one slot. Each tick is
    due in a later slot than the one before, and none is taken before its slot's window opens."""
    node = PolicyNode(pendulum_bundle, _config(realtime=RealtimeConfig(gc="automatic")))
    ticks: list[tuple[float, float]] = []  # (when the tick was taken, the slot it was due in)
    stop = threading.Event()
    loop = threading.Thread(target=node.spin, args=(stop, lambda t: ticks.append((t.time, node.loop.next_at))))
    loop.start()
    rng = np.random.default_rng(0)
    try:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            node.on_joint_state(["hinge"], [0.01], [0.0], [])
            time.sleep(PERIOD * rng.uniform(0.7, 1.3))  # states early, late and near the window's edges
    finally:
        stop.set()
        loop.join(5)
    taken, due = np.array(ticks).T
    assert len(taken) > 50
    early = due - taken
    assert early.max() <= 0.25 * PERIOD + 1e-6, f"a tick came {early.max() * 1e3:.2f} ms before its slot"
    assert np.diff(due).min() > 0, "two ticks were taken for one slot"


@pytest.mark.parametrize("late", [0.4, 0.65])
def test_a_state_the_wire_delayed_does_not_hold_back_the_next_one(pendulum_bundle, late: float) -> None:
    """States on a 20 ms grid, every fifth one `late` periods late (the wire or the sender stalled).
    The slot waits for a late state until the next slot's window opens rather than ticking without it
    and holding it for the next slot, and the node follows the stream's phase, not its last state, so
    the on-time state after a late one is ticked when it arrives, not when a window counted from the
    late one opens."""
    node = PolicyNode(pendulum_bundle, _config(realtime=RealtimeConfig(gc="automatic")))
    stop = threading.Event()
    loop = threading.Thread(target=node.spin, args=(stop, lambda t: None))
    loop.start()
    start = time.monotonic() + PERIOD
    try:
        for k in range(60):
            due = start + k * PERIOD + (late * PERIOD if k % 5 == 4 else 0.0)
            while time.monotonic() < due:
                time.sleep(0.0002)
            node.on_joint_state(["hinge"], [0.01], [0.0], [])
    finally:
        stop.set()
        loop.join(5)
    rows = node.times.recent()
    arrived, began = rows[:, COLUMN["arrived"]], rows[:, COLUMN["began"]]
    fresh = np.isfinite(arrived)
    first = np.argmax(fresh)
    assert fresh[first:].all(), "the timer ticked without a state while every state came within its slot"
    gaps = np.diff(arrived[fresh])
    after_late = np.flatnonzero(gaps < 0.8 * PERIOD) + 1  # the on-time state right after a late one
    assert len(after_late) >= 8, gaps
    waited = began[fresh] - arrived[fresh]
    for name, rows in (("late states", after_late - 1), ("states after a late one", after_late)):
        assert np.median(waited[rows]) < 0.1 * PERIOD, f"{name} waited {np.round(waited[rows] * 1e3, 2)} ms"


def test_no_position_command_leaves_before_the_pose_is_measured(panda_bundle) -> None:
    node = PolicyNode(panda_bundle, _config())
    sent = []
    node.tick_and_publish(sent.append)
    node.final_command(sent.append)
    assert not sent, "a position target (the default pose) went out before any joint state"
    pose = [float(v) for v in node.spec.array("default_position")] + [0.0] * (len(node.joints) - len(node.names))
    node.on_reset()
    node.on_joint_state(list(node.joints), pose, [0.0] * len(node.joints), [])
    node.tick_and_publish(sent.append)
    assert len(sent) == 1 and np.allclose(sent[0].values, pose[: len(node.names)])


def test_a_torque_robot_is_never_damped_with_a_stale_velocity_and_ends_on_zero_effort(pendulum_bundle) -> None:
    node = PolicyNode(pendulum_bundle, _config())
    node.on_estop(True)
    node.on_joint_state(["hinge"], [0.0], [3.0], [])
    fresh = node.tick()
    assert node.shield.mode == Mode.ESTOP and fresh.values[0] < 0.0  # ESTOP damps the measured motion
    time.sleep(node.shield.config.max_state_age * 1.5)
    stale = node.tick()
    assert stale.values[0] == 0.0, "damping from a velocity the shield no longer trusts"
    node.on_joint_state(["hinge"], [0.0], [3.0], [])
    sent = []
    node.final_command(sent.append)
    assert sent and sent[0].command.mode == Mode.ESTOP and np.all(sent[0].values == 0.0)


def test_tick_stamps_catch_a_node_that_answers_every_state_one_period_late() -> None:
    from tests.deploy_ros.probe import match_ticks

    period = 0.002
    sent = np.arange(10) * period
    arrived = sent + 0.0002  # the node receives each state at once ...
    ready = sent + period + 0.0003  # ... and answers it a period later
    arrivals = ready + 0.0001
    assert np.isfinite(match(sent, arrivals, period)[1:]).all(), "the window match is fooled (the reason for ticks)"
    assert np.isinf(match_ticks(sent, arrivals, arrived, ready, period)).all()
    # On time, the probe even receiving a command before the node's write returned.
    on_time = match_ticks(sent, sent + 0.0006, arrived, sent + 0.0005, period)
    assert np.allclose(on_time, 0.0006)


def test_each_lost_state_is_put_down_to_its_cause() -> None:
    from tests.deploy_ros.probe import ProbeResult, lost_causes

    period = 0.002
    sent = np.arange(12) * period
    sent[9] += 0.0008  # the probe sends state 9 late (0.4 of a period)
    arrived = sent + 0.0002
    began = arrived + 0.00005
    keep = np.ones(12, bool)
    keep[6] = False  # state 6: no tick at all while it is current
    arrived[2] = sent[1] + 0.0002  # state 2: the tick while it is current takes state 1 again ...
    arrived[4] = np.nan  # ... 4: the timer's tick without a state (it came after the slot's deadline)
    latency = np.full(12, 0.0005)
    latency[[2, 4, 6, 8, 9]] = np.inf  # 8: ticked on, its command late; 9: ticked on, lost too
    ticks_arrived, ticks_began = arrived[keep], began[keep]
    causes = lost_causes(ProbeResult(1 / period, sent, latency, sent + latency), ticks_arrived, ticks_began)
    assert causes == {"probe_late": 1, "late": 2, "older": 2, "no_tick": 1}
    assert sum(causes.values()) - causes["probe_late"] == 5
    # The echo has no stamps: only the probe's part is known.
    assert lost_causes(ProbeResult(1 / period, sent, latency, sent + latency)) == {"probe_late": 1}


def test_the_lost_ratio_interval_is_clopper_pearson_on_the_nodes_share_of_the_losses() -> None:
    from tests.deploy_ros.probe import rate_ratio_interval

    # 12 of 14 losses the node's: Clopper-Pearson gives its share in [0.5719, 0.9822] (tables).
    low, high = rate_ratio_interval(12, 10_000, 2, 10_000)
    assert low == pytest.approx(0.5719 / 0.4281, rel=1e-3) and high == pytest.approx(0.9822 / 0.0178, rel=2e-3)
    assert rate_ratio_interval(0, 10_000, 4, 10_000) == (0.0, pytest.approx(0.6024 / 0.3976, rel=1e-3))
    # Swapping the sides inverts the interval; twice the exposure halves the node's rate.
    low, high = rate_ratio_interval(30, 10_000, 20, 10_000)
    swapped = rate_ratio_interval(20, 10_000, 30, 10_000)
    assert swapped == (pytest.approx(1 / high), pytest.approx(1 / low))
    assert rate_ratio_interval(30, 20_000, 20, 10_000) == (pytest.approx(low / 2), pytest.approx(high / 2))
    assert rate_ratio_interval(0, 10_000, 0, 10_000) == (0.0, math.inf)
    assert rate_ratio_interval(4, 10_000, 0, 10_000)[1] == math.inf
    # Thousands of losses stay finite (no overflow in the binomial terms) and tight around the ratio.
    low, high = rate_ratio_interval(3000, 20_000, 2500, 20_000)
    assert 1.1 < low < 1.2 < high < 1.3
