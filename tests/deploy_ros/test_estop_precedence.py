"""E-stop precedence as a property: random interleavings of e-stop, release, the operator's stop,
reset and start (as the topics and the services deliver them) and joint states between ticks,
checked against the mode machine's invariants; then the race that used to lose e-stops (a reset and
an e-stop sent back to back) over real DDS."""

from __future__ import annotations

import math
import random
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.requests import Applied
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import DdsNode, wait_for_match
from q2real.safety.flags import Mode, Rule
from q2real.safety.shield import ShieldConfig

DT = 0.02  # hardware/pendulum control period
EVENTS = ("estop", "stop", "release", "reset", "start", "state", "far_state", "tick")


def _node(bundle, autostart: bool) -> PolicyNode:
    return PolicyNode(bundle, NodeConfig(autostart=autostart, shield=ShieldConfig(ramp_time=2 * DT)))


def _running(bundle) -> tuple[PolicyNode, float]:
    """An autostarted node in RUN on a synthetic clock, and the clock's time."""
    node = _node(bundle, autostart=True)
    now = 100.0
    for _ in range(10):
        node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now)
        node.tick(now)
        now += DT
    assert node.shield.mode == Mode.RUN
    return node, now


@pytest.mark.slow  # 300 examples of up to 80 events through the node: 3-7 s on 2 cores
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    autostart=st.booleans(),
    events=st.lists(st.sampled_from(EVENTS), min_size=1, max_size=80),
    positions=st.lists(st.floats(-0.5, 0.5), min_size=80, max_size=80),
)
def test_no_request_that_races_an_estop_undoes_it(pendulum_bundle, autostart, events, positions) -> None:
    node = _node(pendulum_bundle, autostart)
    now = 100.0
    since_tick: list[str] = []
    stopped_once = deferred = False
    for k, event in enumerate([*events, "tick"]):
        if event == "estop":
            node.on_estop(True)
        elif event == "stop":  # ~/stop, and the stop service before it waits for its tick
            node.on_stop()
            event = "estop"
        elif event == "release":
            node.on_estop(False)
        elif event == "reset":
            node.on_reset()
        elif event == "start":
            node.start()
        elif event in ("state", "far_state"):
            # far_state: a pose the ramp must refuse to start from (more than ramp_max_distance away).
            q = positions[k % len(positions)] + (2.0 if event == "far_state" else 0.0)
            node.on_joint_state(["hinge"], [q], [0.0], [], received=now)
        if event != "tick":
            since_tick.append(event)
            continue
        before = node.shield.mode
        tick = node.tick(now)
        after = tick.command.mode
        assert np.isfinite(tick.values).all() and abs(tick.values[0]) <= 2.0
        if "estop" in since_tick:
            assert after == Mode.ESTOP, (since_tick, before, after)
        if before == Mode.ESTOP:
            assert after in (Mode.ESTOP, Mode.PASSIVE), (since_tick, after)
            if "reset" not in since_tick or "estop" in since_tick:
                assert after == Mode.ESTOP, (since_tick, after)
        started = "start" in since_tick[_last(since_tick, "reset") + 1 :]
        if before != Mode.RAMP and after == Mode.RAMP:
            explicit = started or (deferred and "reset" not in since_tick and "estop" not in since_tick)
            assert explicit or (autostart and not stopped_once), (since_tick, autostart, stopped_once)
        # A start sent with the reset that left ESTOP is tried one tick later.
        deferred = before == Mode.ESTOP and after == Mode.PASSIVE and started
        if after == Mode.RUN:
            assert before in (Mode.RAMP, Mode.RUN), (before, after)
        stopped_once |= after == Mode.ESTOP
        since_tick.clear()
        now += DT


def _last(items: list[str], item: str) -> int:
    return max((i for i, x in enumerate(items) if x == item), default=-1)


def test_estop_leads_only_to_passive_and_a_start_sent_with_the_reset_follows_a_tick_later(pendulum_bundle) -> None:
    node, now = _running(pendulum_bundle)
    node.on_estop(True)
    assert node.tick(now).command.mode == Mode.ESTOP
    node.on_reset()
    node.start()
    modes = []
    for i in range(1, 4):
        node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now + i * DT)
        modes.append(node.tick(now + i * DT).command.mode)
    assert modes == [Mode.PASSIVE, Mode.RAMP, Mode.RAMP]


def test_a_start_pressed_before_an_estop_does_not_fire_after_the_reset(pendulum_bundle) -> None:
    node = _node(pendulum_bundle, autostart=False)
    now = 100.0
    node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now)
    node.tick(now)
    node.start()
    node.on_estop(True)
    assert node.tick(now + DT).command.mode == Mode.ESTOP
    node.on_reset()
    for i in range(2, 10):
        node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now + i * DT)
        assert node.tick(now + i * DT).command.mode == Mode.PASSIVE


def test_autostart_never_restarts_from_a_latched_stop(pendulum_bundle) -> None:
    node = _node(pendulum_bundle, autostart=True)
    now = 100.0
    modes = []
    for i in range(40):
        node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now)
        if i == 10:
            node.on_estop(True)
        if i == 15:
            node.on_reset()
        if i == 25:
            node.start()
        modes.append(node.tick(now).command.mode)
        now += DT
    assert Mode.RUN in modes[:10]
    assert set(modes[10:15]) == {Mode.ESTOP} and set(modes[15:25]) == {Mode.PASSIVE}
    assert modes[25] == Mode.RAMP and modes[-1] == Mode.RUN


def test_reset_then_estop_sent_back_to_back_over_dds_always_ends_in_estop(pendulum_bundle, participant) -> None:
    operator = participant("operator")
    robot = participant("robot")
    estop = operator.writer("/q2real_policy/estop", msg.Bool)
    reset = operator.writer("/q2real_policy/reset", msg.Empty)
    states = robot.writer("/joint_states", msg.JointState)
    node = _node(pendulum_bundle, autostart=True)
    transport = DdsNode(node)
    robot.reader(transport.command_topic, transport.command_type)  # the controller
    ticks: list[Mode] = []
    stop = threading.Event()

    def publish(tick) -> None:
        ticks.append(tick.command.mode)
        transport.publish(tick)

    def robot_loop() -> None:
        while not stop.wait(DT / 2):
            states.write(msg.JointState(name=["hinge"], position=[0.1], velocity=[0.0], effort=[]))

    threads = [
        threading.Thread(target=robot_loop, daemon=True),
        threading.Thread(target=node.spin, args=(stop, publish), daemon=True),
    ]
    try:
        for writer in (estop, reset, states):
            wait_for_match(writer)
        for thread in threads:
            thread.start()
        rng = random.Random(7)
        _wait_for(lambda: node.shield.mode == Mode.RUN, "autostart to run the policy")
        estop.write(msg.Bool(data=True))
        _wait_for(lambda: node.shield.mode == Mode.ESTOP, "the first e-stop")
        for trial in range(24):
            gap = rng.uniform(0.0, 0.004)
            reset.write(msg.Empty())
            if gap:
                time.sleep(gap)
            estop.write(msg.Bool(data=True))
            sent = len(ticks)
            time.sleep(rng.uniform(3, 6) * DT)
            assert node.shield.mode == Mode.ESTOP, f"trial {trial}: ended in {node.shield.mode.name}"
            assert Mode.RAMP not in ticks[sent:] and Mode.RUN not in ticks[sent:], f"trial {trial}: {ticks[sent:]}"
    finally:
        stop.set()
        for thread in threads:
            if thread.is_alive():
                thread.join(5)
        transport.close()


def _wait_for(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.002)


def test_a_future_stamp_does_not_extend_the_watchdog(pendulum_bundle) -> None:
    node = _node(pendulum_bundle, autostart=True)
    now = time.monotonic() - 1.0
    for i in range(10):
        node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now + i * DT)
        node.tick(now + i * DT)
    assert node.shield.mode == Mode.RUN
    # A state stamped 50 ms ahead: taken as arriving now, so the node still falls back on time.
    node.on_joint_state(["hinge"], [0.1], [0.0], [], received=time.monotonic() + 0.05)
    last = node.states.latest.received
    assert last <= time.monotonic()
    age = node.shield.config.max_state_age
    assert node.tick(last + age + DT).command.mode == Mode.HOLD


def test_a_megabyte_refusal_is_not_republished_whole(pendulum_bundle) -> None:
    node = _node(pendulum_bundle, autostart=False)
    huge = "j" * 1_000_000
    reason = node.on_joint_state([huge], [0.0], [0.0], [])
    assert reason is not None and len(reason) < 1000
    assert len(node.diagnostics()["values"]["last_refusal"]) <= 300
    assert node.on_task_command([math.nan] * 100_000) is not None
    assert len(node.diagnostics()["values"]["last_refusal"]) <= 300


def test_the_shutdown_estop_wins_over_a_pending_reset(pendulum_bundle) -> None:
    node, now = _running(pendulum_bundle)
    node.on_estop(True)
    node.tick(now)
    node.on_reset()  # arrives as the node is stopped: the last command must still be the latched stop
    node.on_estop(True, "node stopped")
    last = node.tick(now + DT)
    assert last.command.mode == Mode.ESTOP


def test_a_reset_sent_before_the_shield_latched_a_fault_does_not_clear_it(pendulum_bundle) -> None:
    node, now = _running(pendulum_bundle)
    node.on_reset()  # queued for the next tick...
    node.on_joint_state(["hinge"], [0.1], [1e4], [], received=now)  # ...and this state latches a sensor fault
    node.requests.apply = lambda shield: Applied()  # the reset lands after this tick's requests were taken
    fault = node.tick(now)
    assert fault.command.mode == Mode.ESTOP and "velocity limit" in fault.command.reason
    del node.requests.apply
    node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now + DT)
    assert node.tick(now + DT).command.mode == Mode.ESTOP
    node.on_reset()
    assert node.tick(now + 2 * DT).command.mode == Mode.PASSIVE


def test_an_estop_ends_the_loops_wait_at_once(pendulum_bundle) -> None:
    config = NodeConfig(trigger="timer", control_period=0.5, shield=ShieldConfig(ramp_time=1.0))
    node = PolicyNode(pendulum_bundle, config)
    stop = threading.Event()
    ticks: list[tuple[float, Mode]] = []
    thread = threading.Thread(target=node.spin, args=(stop, lambda t: ticks.append((time.monotonic(), t.command.mode))))
    thread.start()
    try:
        _wait_for(lambda: len(ticks) >= 1, "the first tick")
        time.sleep(0.05)
        sent = time.monotonic()
        node.on_estop(True)
        _wait_for(lambda: ticks[-1][1] == Mode.ESTOP, "ESTOP", timeout=2.0)
    finally:
        stop.set()
        node.on_estop(True)
        thread.join(5)
    latched = next(t for t, mode in ticks if mode == Mode.ESTOP)
    assert latched - sent < 0.1, f"the e-stop waited {latched - sent:.3f} s for a 0.5 s period"


def test_a_policy_that_fails_or_misshapes_at_run_time_never_reaches_the_robot(pendulum_bundle) -> None:
    node, now = _running(pendulum_bundle)

    def fails(*_):
        raise RuntimeError("onnxruntime: invalid input")

    # onnxruntime cannot be made to do either on a valid graph: its run is replaced for these ticks.
    for run, reason in [
        (fails, "policy: the bundle failed"),
        (lambda *_: (np.ones((3, 1), np.float32), None), "shape"),
    ]:
        node.bundle.act = run
        node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now)
        tick = node.tick(now)
        now += DT
        assert tick.command.flags & (Rule.DEADLINE_MISS | Rule.ACTION_SHAPE), tick.command.flags
        assert reason in node.last_refusal and np.isfinite(tick.values).all()


def test_the_operator_stops_resets_and_starts_again_without_restarting_the_node(pendulum_bundle) -> None:
    """What a ROS 2 panel's services do (`operate`, the rclpy node's std_srvs/Trigger): each request is
    answered with the mode the next ticks left, and after a stop the policy runs again on reset + start."""
    config = NodeConfig(trigger="timer", control_period=DT, shield=ShieldConfig(ramp_time=0.05))
    node = PolicyNode(pendulum_bundle, config)
    stop = threading.Event()
    thread = threading.Thread(target=node.spin, args=(stop, lambda _t: None))
    feeding = threading.Event()

    def robot() -> None:  # joint states at the pendulum's rate, hanging at rest
        while not feeding.wait(DT):
            node.on_joint_state(["hinge"], [0.0], [0.0], [])

    feeder = threading.Thread(target=robot)
    feeder.start()
    thread.start()
    try:
        _wait_for(lambda: node.ticks > 3, "the first ticks")
        assert node.operate("start") == (True, "mode RAMP")
        _wait_for(lambda: node.shield.mode == Mode.RUN, "RUN after the ramp")
        assert node.operate("stop") == (True, "mode ESTOP")
        refused, why = node.operate("start")
        assert not refused and why.startswith("mode ESTOP"), why  # a latched stop needs a reset first
        assert node.operate("reset") == (True, "mode PASSIVE")
        started, _ = node.operate("start")
        assert started
        _wait_for(lambda: node.shield.mode == Mode.RUN, "RUN again, same process")
    finally:
        feeding.set()
        stop.set()
        node.on_estop(True)
        thread.join(5)
        feeder.join(5)
    with pytest.raises(ValueError, match="expected start, stop or reset"):
        node.operate("launch")
