"""`q2real operator` against a node on the wire: each request answered with the mode it reached, a
refused start with the node's reason, and no node a clear error within the timeout."""

from __future__ import annotations

import contextlib
import re
import threading
import time

import pytest

from q2real.cli.main import main
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.session import ModeLines, deploy
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import SENSOR_QOS, DdsNode, wait_for_match
from q2real.safety.shield import ShieldConfig

PERIOD = 0.02  # hardware/pendulum control period


def test_a_request_with_no_node_on_the_domain_fails_within_the_timeout_naming_topic_and_domain(
    dds_domain, capsys
) -> None:
    began = time.monotonic()
    code = main(["operator", "start", "--node", "arm", "--timeout", "0.5"])
    err = capsys.readouterr().err
    assert code == 1 and time.monotonic() - began < 3.0
    assert f"no node reads /arm/start on DDS domain {dds_domain} within 0.5 s" in err, err
    assert main(["operator", "status", "--timeout", "0.5"]) == 1
    assert f"no q2real node reported on /diagnostics within 0.5 s (DDS domain {dds_domain})" in capsys.readouterr().err


def test_a_bad_timeout_or_node_name_is_refused_naming_the_flag(capsys) -> None:
    assert main(["operator", "stop", "--timeout", "0"]) == 2
    assert "--timeout: expected seconds > 0, got 0.0" in capsys.readouterr().err
    assert main(["operator", "stop", "--node", "my node"]) == 2
    assert "--node: expected a ROS 2 name" in capsys.readouterr().err


@contextlib.contextmanager
def _node_on_a_fake_robot(bundle, participant, on_report):
    """The node on DDS, fed joint states at its rate by a robot whose controller reads its commands."""
    robot = participant("fake_robot")
    states = robot.writer("/joint_states", msg.JointState, SENSOR_QOS)
    robot.reader("/forward_command_controller/commands", msg.Float64MultiArray)
    node = PolicyNode(bundle, NodeConfig(startup_timeout=20.0, shield=ShieldConfig(ramp_time=0.2)))
    transport = DdsNode(node, on_report=on_report)
    wait_for_match(states)
    stop = threading.Event()

    def publish() -> None:
        state = msg.JointState(name=["hinge"], position=[0.05], velocity=[0.0], effort=[])
        while not stop.wait(PERIOD):
            states.write(state)

    robot_thread = threading.Thread(target=publish, daemon=True)
    robot_thread.start()
    transport.wait_for_robot()
    loop = threading.Thread(target=node.spin, args=(stop, transport.publish), daemon=True)
    loop.start()
    try:
        yield node
    finally:
        stop.set()
        loop.join(5)
        robot_thread.join(5)
        transport.close()


def _operate(capsys, *args: str) -> tuple[int, str]:
    code = main(["operator", *args, "--timeout", "10"])
    return code, capsys.readouterr().out.strip()


@pytest.mark.slow  # a node ticking in real time on the wire
def test_q2real_operator_runs_a_node_through_start_stop_refused_start_reset_and_estop(
    pendulum_bundle, participant, capsys
) -> None:
    lines: list[tuple[str, str]] = []
    on_report = ModeLines(lambda line: lines.append((threading.current_thread().name, line)))
    with _node_on_a_fake_robot(pendulum_bundle, participant, on_report):
        code, out = _operate(capsys, "start")
        assert code == 0 and out.startswith(("mode RAMP", "mode RUN")), out
        code, out = _operate(capsys, "stop", "--loopback")
        assert (code, out) == (0, "mode ESTOP: operator stop")
        code, out = _operate(capsys, "start")
        assert code == 1 and out.startswith("mode ESTOP: start: the shield is in ESTOP, which only a reset leaves"), out
        code, out = _operate(capsys, "start")  # the same refusal again: said, though the node's reason is unchanged
        assert code == 1 and out.startswith("mode ESTOP: start: the shield is in ESTOP"), out
        code, out = _operate(capsys, "reset")
        assert (code, out) == (0, "mode PASSIVE: operator reset")
        code, out = _operate(capsys, "reset")  # nothing to leave: still carried out, PASSIVE is where it goes
        assert (code, out) == (0, "mode PASSIVE")
        code, out = _operate(capsys, "status")
        assert code == 0 and "pendulum" in out and "mode PASSIVE" in out and "ticks" in out, out
        code, out = _operate(capsys, "estop")
        assert (code, out) == (0, "mode ESTOP: e-stop message")
    said = [line.split("  ", 1)[1] for _, line in lines]
    assert "mode ESTOP: operator stop" in said and "mode PASSIVE: operator reset" in said, said
    assert any(line.startswith("mode RAMP: operator start") for line in said), said
    assert any(line.startswith("mode ESTOP: start: the shield is in ESTOP") for line in said), said
    assert {thread for thread, _ in lines} == {"q2real-diagnostics"}, "a mode line was printed off the diagnostics"


@pytest.mark.slow  # the sim robot process and the node in real time
def test_deploy_prints_each_mode_change_with_its_reason_and_q2real_operator_stops_it(
    pendulum_bundle, dds_domain, capsys
) -> None:
    """The path the README shows: `deploy --sim` in one place, `q2real operator stop` in another."""
    stop = threading.Event()
    errors: list[BaseException] = []
    config = NodeConfig(autostart=True, shield=ShieldConfig(ramp_time=0.2))

    def run() -> None:
        try:
            deploy(pendulum_bundle, config, sim=True, stop=stop)
        except BaseException as err:  # surfaced below
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out = ""
    try:
        deadline = time.monotonic() + 60
        while "mode RUN: operator run" not in out and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
            out += capsys.readouterr().out
        assert main(["operator", "stop", "--loopback", "--timeout", "10"]) == 0, out
    finally:
        stop.set()
        thread.join(30)
    out += capsys.readouterr().out
    assert not errors, errors
    said = [line for line in out.splitlines() if re.fullmatch(r"\d\d:\d\d:\d\d  mode [A-Z_]+: .*", line)]
    said = [line[10:] for line in said]
    assert said[:2] == [
        "mode RAMP: autostart: ramping from the measured pose to the default pose",  # --sim starts by itself
        "mode RUN: operator run: policy in control",
    ], out
    assert "mode ESTOP: operator stop" in said, out
