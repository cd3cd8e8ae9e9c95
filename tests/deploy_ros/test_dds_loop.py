"""The node and the sim robot as separate DDS participants on loopback, as on a robot: the trained
policy swings the pendulum up through messages alone, and faults are handled on the wire."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time

import numpy as np
import pytest
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore

from q2real.cli.main import main
from q2real.contracts.schema import BundleError
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.session import start_sim_robot
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import SENSOR_QOS, DdsNode, Endpoints, wait_for_match
from q2real.safety.flags import Mode
from q2real.safety.shield import ShieldConfig

pytestmark = pytest.mark.slow  # real-time DDS against the sim robot process

PERIOD = 0.02  # hardware/pendulum control period


class Listener:
    """A third participant that records what is on the wire."""

    def __init__(self, endpoints: Endpoints, command_topic: str = "/forward_command_controller/commands"):
        self.endpoints = endpoints
        self.states: list[tuple[float, float]] = []
        self.commands: list[list[float]] = []
        self.diagnostics: list[msg.DiagnosticArray] = []
        self.readers = [
            self.endpoints.reader(
                "/joint_states",
                msg.JointState,
                lambda m: self.states.append((time.monotonic(), m.position[0])),
                SENSOR_QOS,
            ),
            self.endpoints.reader(command_topic, msg.Float64MultiArray, lambda m: self.commands.append(list(m.data))),
            self.endpoints.reader("/diagnostics", msg.DiagnosticArray, self.diagnostics.append),
        ]

    def modes(self) -> list[str]:
        return [d.status[0].message.split(":")[0] for d in self.diagnostics]


@contextlib.contextmanager
def running(bundle, config: NodeConfig, robot: str = "pendulum", extra: list[str] | None = None):
    """Sim robot process + node thread; yields (node, transport, robot process)."""
    process = start_sim_robot(robot, config, extra=extra)
    node = PolicyNode(bundle, config)
    transport = DdsNode(node)
    stop = threading.Event()
    errors: list[BaseException] = []

    def spin() -> None:
        try:
            transport.run(stop)
        except BaseException as err:  # surfaced by the test below
            errors.append(err)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield node, transport, process, errors
    finally:
        stop.set()
        thread.join(10)
        transport.close()
        process.kill()
        process.wait(10)


def _wait_for(condition, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)
    return time.monotonic()


def _config(**shield) -> NodeConfig:
    return NodeConfig(autostart=True, startup_timeout=20.0, shield=ShieldConfig(ramp_time=0.2, **shield))


@pytest.mark.timeout(900)
def test_trained_policy_swings_up_the_sim_robot_through_ros2_messages(trained_bundle, participant, tmp_path, capsys):
    listener = Listener(participant("observer"))
    bag = tmp_path / "bag"
    code = main(["deploy", str(trained_bundle), "--sim", "--duration", "10", "shield.ramp_time=0.5", f"record={bag}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "stopped (duration) after" in out and "in mode RUN;" in out, out
    t = np.array([s[0] for s in listener.states])
    angle = np.array([s[1] for s in listener.states])
    assert len(angle) > 400, f"only {len(angle)} joint states seen on the wire"
    upright = (1 - np.cos(angle)) / 2  # hinge 0 hangs down, pi is upright
    final = upright[t > t[-1] - 2.0]
    assert final.mean() > 0.95, f"pendulum not balanced at the end: mean uprightness {final.mean():.3f}"
    commands = np.array(listener.commands)
    assert commands.shape[1] == 1 and np.isfinite(commands).all() and np.abs(commands).max() <= 2.0
    assert np.abs(commands).max() > 0.5, "the policy never pushed"
    # The bag holds every tick: observation and raw action while running, command, flags and mode always.
    store = get_typestore(Stores.ROS2_JAZZY)
    with Reader(bag) as reader:
        counts = {c.topic: c.msgcount for c in reader.connections}
        modes = [
            store.deserialize_cdr(raw, c.msgtype).data
            for c, _, raw in reader.messages()
            if c.topic == "/q2real_policy/shield_mode"
        ]
    assert counts["/forward_command_controller/commands"] == counts["/q2real_policy/shield_flags"] == len(modes)
    assert counts["/q2real_policy/observation"] == counts["/q2real_policy/action_raw"] == modes.count(Mode.RUN)
    assert len(modes) > 400 and counts["/q2real_policy/bundle"] == 1
    assert counts["/joint_states"] >= len(modes) - 5, "the bag must hold what the robot sent, as it arrived"
    assert modes[-1] == Mode.ESTOP, "stopping the node must leave the robot in the latched stop"


def test_robot_process_dying_drops_the_node_to_hold_within_the_state_age(pendulum_bundle, participant):
    listener = Listener(participant("observer"))
    with running(pendulum_bundle, _config(max_state_age=0.1, fallback="hold")) as (node, _, robot, errors):
        _wait_for(lambda: node.shield.mode == Mode.RUN or errors, 30, "RUN")
        assert not errors, errors
        time.sleep(0.5)
        robot.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        held = _wait_for(lambda: node.shield.mode == Mode.HOLD, 2, "HOLD after the robot died")
        _wait_for(lambda: "HOLD" in listener.modes(), 2, "HOLD on /diagnostics")
    # The last state left the robot up to one period before the kill; allow one tick of scheduling.
    assert held - killed <= 0.1 + 2 * PERIOD + 0.02, f"HOLD came {held - killed:.3f} s after the robot died"


def test_estop_message_latches_within_one_tick(pendulum_bundle, participant):
    estop = participant("operator").writer("/q2real_policy/estop", msg.Bool)
    with running(pendulum_bundle, _config()) as (node, transport, _, errors):
        arrivals: list[float] = []
        ticks: list[tuple[float, Mode]] = []
        on_estop, publish = node.on_estop, transport.publish
        node.on_estop = lambda engaged: (arrivals.append(time.monotonic()), on_estop(engaged))
        transport.publish = lambda tick: (ticks.append((tick.time, tick.command.mode)), publish(tick))
        _wait_for(lambda: node.shield.mode == Mode.RUN or errors, 30, "RUN")
        assert not errors, errors
        wait_for_match(estop)
        estop.write(msg.Bool(data=True))
        _wait_for(lambda: node.shield.mode == Mode.ESTOP, 2, "ESTOP")
        time.sleep(0.1)
        estop.write(msg.Bool(data=False))  # releasing the button does not clear a latched stop
        time.sleep(0.2)
        assert node.shield.mode == Mode.ESTOP
    # The first tick that starts after the message arrived is already in ESTOP, and it starts at once.
    after = [(started, mode) for started, mode in ticks if started > arrivals[0]]
    assert after[0][1] == Mode.ESTOP, f"tick after the e-stop ran in {after[0][1].name}"
    assert after[0][0] - arrivals[0] < PERIOD, "the e-stop waited for the next control period"


def test_malformed_joint_states_on_the_wire_are_refused_and_commands_stay_safe(pendulum_bundle, participant):
    listener = Listener(participant("observer"))
    states = participant("fake_robot").writer("/joint_states", msg.JointState)
    node = PolicyNode(pendulum_bundle, _config())
    transport = DdsNode(node)
    wait_for_match(states)
    good = msg.JointState(name=["hinge"], position=[0.2], velocity=[0.0], effort=[math.nan])
    bad = [
        msg.JointState(name=["hinge"], position=[math.nan], velocity=[0.0]),
        msg.JointState(name=["hinge"], position=[0.2, 0.3], velocity=[0.0]),
        msg.JointState(name=["hinge", "elbow"], position=[0.2, 0.1], velocity=[0.0, 0.0]),
        msg.JointState(name=["wrist"], position=[0.2], velocity=[0.0]),
    ]
    stop = threading.Event()
    states.write(good)
    transport.wait_for_robot()
    thread = threading.Thread(target=node.spin, args=(stop, transport.publish), daemon=True)
    thread.start()
    try:
        for i in range(60):
            states.write(bad[i % len(bad)] if i % 3 == 2 else good)
            time.sleep(PERIOD)
        _wait_for(lambda: sum(node.refused.values()) == 20, 2, "all 20 bad messages refused")
        time.sleep(0.6)  # one more diagnostics period
    finally:
        stop.set()
        thread.join(5)
        transport.close()
    assert dict(node.refused) == {"nonfinite": 5, "lengths": 5, "unknown": 10}
    commands = np.array(listener.commands)
    assert len(commands) > 30 and np.isfinite(commands).all() and np.abs(commands).max() <= 2.0
    values = {kv.key: kv.value for kv in listener.diagnostics[-1].status[0].values}
    assert values["refused_messages"] == "20" and values["refused.unknown"] == "10"
    assert listener.diagnostics[-1].status[0].level >= 1


def test_a_bundle_for_another_robot_is_refused_when_the_robot_appears(cartpole_bundle, dds_domain):
    config = _config()
    config.startup_timeout = 20.0
    with running(cartpole_bundle, config, robot="pendulum") as (_, _, _, errors):
        _wait_for(lambda: errors, 25, "the node to refuse the pendulum robot")
    assert isinstance(errors[0], BundleError)
    assert "missing ['slider']" in str(errors[0])  # the cartpole policy also reads the pole's 'hinge'
    assert "robot publishes ['hinge']" in str(errors[0])


def test_the_node_stays_passive_until_a_controller_subscribes_to_its_commands(pendulum_bundle, participant):
    robot = participant("robot")
    states = robot.writer("/joint_states", msg.JointState, SENSOR_QOS)
    node = PolicyNode(pendulum_bundle, _config())
    transport = DdsNode(node)
    wait_for_match(states)
    state = msg.JointState(name=["hinge"], position=[0.05], velocity=[0.0], effort=[])
    stop = threading.Event()
    thread = threading.Thread(target=node.spin, args=(stop, transport.publish), daemon=True)
    thread.start()
    try:
        for _ in range(40):
            states.write(state)
            time.sleep(PERIOD)
        assert node.shield.mode == Mode.PASSIVE and node.ticks > 20
        waiting = node.diagnostics()["values"]["waiting_for_controller"]
        assert waiting.startswith("no subscriber on /forward_command_controller/commands")
        assert node.diagnostics()["level"] == 1
        robot.reader("/forward_command_controller/commands", msg.Float64MultiArray)  # the controller comes up
        for _ in range(100):
            states.write(state)
            time.sleep(PERIOD)
            if node.shield.mode == Mode.RUN:
                break
    finally:
        stop.set()
        thread.join(5)
        transport.close()
    assert node.shield.mode == Mode.RUN and "waiting_for_controller" not in node.diagnostics()["values"]


def test_q2real_monitor_follows_a_running_nodes_diagnostics_over_dds(pendulum_bundle) -> None:
    from q2real.deploy_ros.watch.monitor import monitor

    lines: list[str] = []
    with running(pendulum_bundle, _config()) as (node, _, _, errors):
        _wait_for(lambda: node.shield.mode == Mode.RUN or errors, 30, "RUN")
        assert not errors, errors
        shown = monitor(duration=10.0, count=3, out=lines.append)
    assert shown == 3 and all("pendulum" in line and "mode RUN" in line and "ticks" in line for line in lines), lines
