"""Stops on the wire against a robot that follows every command exactly, as ros2_control's mock
hardware and stiff position servos do: the node and the robot are separate DDS participants, the
policy drives the Panda's joints at their velocity limits, and an operator stop, an e-stop and a
fall-back to HOLD (the robot's joint states stop arriving) each leave the published targets where the
stop found them. The arm then stays near its default pose, so a reset and a start ramp again."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import SENSOR_QOS, DdsNode, Endpoints, wait_for_match
from q2real.safety.flags import Mode
from q2real.safety.shield import ShieldConfig
from tests.deploy_ros.conftest import export_fresh_agent

pytestmark = pytest.mark.slow  # real-time DDS, about 10 s

FULL_SCALE = [5.0, -5.0, 5.0, -5.0, 5.0, -5.0, 5.0]
"""The policy's mean before tanh: every joint pushed towards a limit, whatever it observes."""


def _full_scale(agent) -> None:
    head = agent.actor.head
    with torch.no_grad():
        head.weight.zero_()
        head.bias[..., : agent.policy_dim].copy_(torch.tensor(FULL_SCALE))


class MockHardware:
    """The robot: its joints are exactly the last command received, reported every period."""

    def __init__(self, endpoints: Endpoints, names: list[str], pose: np.ndarray, period: float, command_topic: str):
        self.names, self.period = names, period
        self.q, self.qd = pose.copy(), np.zeros(len(names))
        self.lock = threading.Lock()
        self.reporting = threading.Event()
        self.reporting.set()
        self.states = endpoints.writer("/joint_states", msg.JointState, SENSOR_QOS)
        self.commands = endpoints.reader(command_topic, msg.Float64MultiArray, self._on_command)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._report, daemon=True)

    def _on_command(self, message: msg.Float64MultiArray) -> None:
        target = np.array(message.data)
        with self.lock:
            self.qd, self.q = (target - self.q) / self.period, target

    def _report(self) -> None:
        while not self._stop.wait(self.period):
            if not self.reporting.is_set():
                continue
            with self.lock:
                q, qd = self.q.tolist(), self.qd.tolist()
            now = time.time()
            stamp = msg.Time(sec=int(now), nanosec=int((now % 1) * 1e9))
            self.states.write(msg.JointState(msg.Header(stamp), self.names, q, qd, [0.0] * len(q)))

    def __enter__(self) -> MockHardware:
        wait_for_match(self.states)
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(2)


@dataclass
class Published:
    """Every tick the node published: its mode and targets."""

    modes: list[Mode] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def since(self, start: int) -> tuple[list[Mode], np.ndarray]:
        with self.lock:
            return self.modes[start:], np.array(self.targets[start:])

    def __len__(self) -> int:
        return len(self.modes)


def _wait_for(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def _moving_then_stopped(node: PolicyNode, published: Published, stop, how: str) -> float:
    """Waits for the arm to move in RUN, stops it with `stop()`, and checks the targets after the stop
    stay where it found them; returns the commanded speed (rad/s) when the stop came."""
    _wait_for(lambda: node.shield.mode == Mode.RUN, f"RUN before the {how}")
    start = len(published)
    _wait_for(lambda: len(published) > start + 10, "10 ticks of RUN")
    stop()
    _wait_for(lambda: node.shield.mode in (Mode.ESTOP, Mode.HOLD), how)
    time.sleep(1.0)
    modes, targets = published.since(start)
    first = next(i for i, mode in enumerate(modes) if mode in (Mode.ESTOP, Mode.HOLD))
    assert modes[first - 1] == Mode.RUN
    speed = float(np.abs(targets[first - 1] - targets[first - 2]).max()) / node.period
    travel = np.abs(targets[first:] - targets[first - 1]).max()
    assert len(targets) - first > 20, f"only {len(targets) - first} ticks after the {how}"
    assert travel == 0.0, f"the targets travelled {travel:.3f} rad after the {how}"
    return speed


def test_stops_latch_the_targets_of_a_robot_that_follows_every_command(tmp_path, participant) -> None:
    bundle = export_fresh_agent("panda_reach", tmp_path / "panda.onnx", edit_agent=_full_scale)
    config = NodeConfig(startup_timeout=20.0, shield=ShieldConfig(ramp_time=0.2, max_state_age=0.1))
    node = PolicyNode(bundle, config)
    assert node.shield.fallback == "hold"
    published = Published()
    transport = DdsNode(node)
    publish = transport.publish

    def record(tick) -> None:
        with published.lock:
            published.modes.append(tick.command.mode)
            published.targets.append(np.array(tick.values))
        publish(tick)

    operator = participant("operator")
    writers = {
        topic: operator.writer(f"/q2real_policy/{topic}", kind)
        for topic, kind in [("start", msg.Empty), ("stop", msg.Empty), ("reset", msg.Empty), ("estop", msg.Bool)]
    }
    target = operator.writer("/q2real_policy/command", msg.Float64MultiArray)
    robot = MockHardware(
        participant("robot"),
        list(node.names),
        node.spec.array("default_position"),
        node.period,
        config.command_topic(),
    )
    stop = threading.Event()
    thread = threading.Thread(target=lambda: (transport.wait_for_robot(), node.spin(stop, record)), daemon=True)
    speeds = []
    with robot:
        thread.start()
        try:
            for writer in (*writers.values(), target):
                wait_for_match(writer)
            target.write(msg.Float64MultiArray(data=[0.45, 0.0, 0.4]))

            def start() -> None:
                writers["start"].write(msg.Empty())

            def restart() -> None:
                writers["reset"].write(msg.Empty())
                _wait_for(lambda: node.shield.mode == Mode.PASSIVE, "PASSIVE after the reset")
                start()

            def stale() -> None:
                robot.reporting.clear()

            _wait_for(lambda: node.shield.has_pose, "the robot's first joint state")
            start()
            speeds.append(_moving_then_stopped(node, published, lambda: writers["stop"].write(msg.Empty()), "stop"))
            restart()
            speeds.append(
                _moving_then_stopped(node, published, lambda: writers["estop"].write(msg.Bool(data=True)), "e-stop")
            )
            restart()
            speeds.append(_moving_then_stopped(node, published, stale, "fall-back to HOLD"))
            assert node.shield.mode == Mode.HOLD
        finally:
            stop.set()
            thread.join(5)
            transport.close()
    # Each stop found the arm moving (not a vacuous stop), and the arm stayed near its default pose.
    assert min(speeds) > 1.0, f"commanded speeds when the stops came: {speeds}"
    distance = np.abs(robot.q - node.spec.array("default_position")).max()
    assert distance < config.shield.ramp_max_distance, f"the arm ended {distance:.2f} rad from its default pose"
