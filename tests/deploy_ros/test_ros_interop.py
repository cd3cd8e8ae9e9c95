"""q2real's DDS-wire node and sim robot against real ROS 2 participants: rclpy on rmw_fastrtps_cpp,
ROS 2's default middleware, for Jazzy (Fast DDS 2.14, in the test venv) and Kilted (Fast DDS 3, in
`.venv-kilted`, which `.ci/run` makes), both directions, every message type the node uses, with
ros2_control's QoS, all on loopback."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.session import start_sim_robot, stop_sim_robot
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.transport.dds import DdsNode
from q2real.safety.flags import Mode
from q2real.safety.shield import ShieldConfig

pytestmark = pytest.mark.slow  # ROS 2 processes, discovery and seconds of traffic

ROOT = Path(__file__).resolve().parents[2]
PEER = Path(__file__).with_name("ros_peer.py")
KILTED = ROOT / ".venv-kilted" / "bin" / "python"


def _peer_python(distro: str) -> str:
    if distro == "jazzy":
        pytest.importorskip("rclpy", reason="rclpy (ROS 2 Jazzy wheels, x86_64 only) is not installed")
        return sys.executable
    if not KILTED.exists():
        pytest.skip(f"no ROS 2 Kilted peer at {KILTED} (.ci/run makes it: a venv with only the Kilted wheels)")
    return str(KILTED)


def run_peer(distro: str, spec: dict) -> dict:
    """Run the ROS 2 peer for spec['seconds'] and return what it received and sent."""
    # The ROS wheels' bootstrapper puts its own install's libraries on LD_LIBRARY_PATH and marks the
    # environment done; a peer from another install must start from neither.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "_ROS_WHEELS_BOOTSTRAP_COMPLETE")}
    if distro == "kilted":
        env.pop("FASTRTPS_DEFAULT_PROFILES_FILE", None)  # Fast DDS 3 reads FASTDDS_DEFAULT_PROFILES_FILE
    out = subprocess.run(
        [_peer_python(distro), str(PEER), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=spec["seconds"] + spec.get("wait", 30.0) + 60,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def node_running(bundle, config: NodeConfig):
    """The q2real node on DDS in a thread of this process, until the block ends."""
    node = PolicyNode(bundle, config)
    transport = DdsNode(node)
    stop = threading.Event()
    thread = threading.Thread(target=transport.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield node
    finally:
        stop.set()
        thread.join(10)
        transport.close()


def _modes_during(node: PolicyNode, seconds: float, run):
    """The node's mode every 10 ms for the first `seconds` of `run()`, and what it returned."""
    modes: list[Mode] = []

    def watch() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            modes.append(node.shield.mode)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    result = run()
    watcher.join()
    return modes, result


def _config(**fields) -> NodeConfig:
    return NodeConfig(autostart=True, startup_timeout=30.0, shield=ShieldConfig(ramp_time=0.2), **fields)


DISTROS = ["jazzy", "kilted"]
# The operator acts on what the panel reads: an e-stop once the node is in RUN, then a reset.
OPERATOR_STOPS_AND_RESETS = [
    {
        "topic": "/q2real_policy/estop",
        "type": "Bool",
        "when": {"topic": "/q2real_policy/mode", "data": {"data": "RUN"}},
        "at": 0.5,
        "once": True,
        "data": {"data": True},
    },
    {"topic": "/q2real_policy/reset", "type": "Empty", "after": "/q2real_policy/estop", "at": 1.0, "once": True},
]


@pytest.mark.parametrize("distro", DISTROS)
@pytest.mark.parametrize("style", ["forward", "trajectory"])
def test_a_ros2_peer_receives_joint_states_commands_and_diagnostics(distro, style, trained_bundle, dds_domain):
    _peer_python(distro)
    config = _config(command_style=style)
    commands = config.command_topic()
    kind = "JointTrajectory" if style == "trajectory" else "Float64MultiArray"
    robot = start_sim_robot("pendulum", config)
    try:
        with node_running(trained_bundle, config):
            spec = {
                "seconds": 5.0,
                "from_first": True,
                "subscribe": {"/joint_states": "JointState", commands: kind, "/diagnostics": "DiagnosticArray"},
            }
            got = run_peer(distro, spec)["received"]
    finally:
        stop_sim_robot(robot)
    states, sent, diagnostics = got["/joint_states"], got[commands], got["/diagnostics"]
    assert states["count"] > 100 and states["last"]["name"] == ["hinge"], states
    assert math.isfinite(states["last"]["position"][0])
    assert sent["count"] > 100, f"{distro} peer received {sent['count']} {kind} commands"
    if style == "forward":
        assert len(sent["last"]["data"]) == 1 and sent["last"]["dim"] == ["joints"]
    else:
        last = sent["last"]
        assert last["joint_names"] == ["hinge"] and len(last["effort"]) == 1 and not last["positions"]
        assert last["time_from_start"] == pytest.approx(0.02)
    assert diagnostics["count"] >= 3 and diagnostics["last"]["name"] == "q2real_policy: shield"
    assert {"mode", "latency_p99_ms", "stage_p99_ms.policy"} <= set(diagnostics["last"]["keys"])


@pytest.mark.parametrize("distro", DISTROS)
def test_the_node_runs_a_ros2_robot_and_obeys_its_operator_topics(distro, pendulum_bundle, dds_domain):
    """The peer is the robot (joint states as joint_state_broadcaster publishes them) and the operator
    (an e-stop, then a reset); the node answers every state with a command."""
    _peer_python(distro)
    state = {"name": ["hinge"], "position": [0.05], "velocity": [0.0], "effort": [None]}
    spec = {
        "seconds": 6.0,
        "subscribe": {"/forward_command_controller/commands": "Float64MultiArray", "/q2real_policy/mode": "String"},
        "publish": [
            {"topic": "/joint_states", "type": "JointState", "rate": 50.0, "data": state},
            *OPERATOR_STOPS_AND_RESETS,
        ],
    }
    with node_running(pendulum_bundle, _config()) as node:
        modes, got = _modes_during(node, 5.5, lambda: run_peer(distro, spec))
    commands = got["received"]["/forward_command_controller/commands"]
    assert commands["count"] > 100, commands
    assert Mode.RUN in modes and Mode.ESTOP in modes, f"modes seen: {sorted(set(modes))}"
    assert modes.index(Mode.ESTOP) > modes.index(Mode.RUN)
    assert node.shield.mode == Mode.PASSIVE, "the reset did not arrive (autostart never restarts after an e-stop)"
    assert not node.refused


@pytest.mark.parametrize("distro", DISTROS)
def test_a_ros2_operator_stops_resets_and_starts_the_policy_again_without_a_restart(
    distro, pendulum_bundle, dds_domain
):
    """E-stop, reset, start from a ROS 2 panel (the node's operator topics), one process throughout:
    the policy runs again, and the panel reads every mode on the node's latched ~/mode."""
    _peer_python(distro)
    state = {"name": ["hinge"], "position": [0.05], "velocity": [0.0], "effort": [None]}
    spec = {
        "seconds": 8.0,
        "subscribe": {"/q2real_policy/mode": "String"},
        "publish": [
            {"topic": "/joint_states", "type": "JointState", "rate": 50.0, "data": state},
            *OPERATOR_STOPS_AND_RESETS,
            {
                "topic": "/q2real_policy/start",
                "type": "Empty",
                "after": "/q2real_policy/reset",
                "at": 1.0,
                "once": True,
            },
        ],
    }
    with node_running(pendulum_bundle, _config(require_subscriber=False)) as node:
        modes, got = _modes_during(node, 7.0, lambda: run_peer(distro, spec))
    # (After the peer, the robot, stops publishing, the node holds: the watcher ends before that.)
    changes = [m for i, m in enumerate(modes) if i == 0 or m != modes[i - 1]]
    assert changes[-1] == Mode.RUN, f"modes: {changes}"
    estop = changes.index(Mode.ESTOP)
    assert Mode.RUN in changes[:estop] and changes[estop:].index(Mode.PASSIVE) < changes[estop:].index(Mode.RUN)
    panel = got["received"]["/q2real_policy/mode"]
    assert panel["count"] >= 4 and panel["last"] == {"data": "RUN"}, panel


@pytest.mark.parametrize("distro", DISTROS)
def test_a_task_command_from_a_ros2_peer_reaches_the_observation(distro, panda_bundle, dds_domain):
    _peer_python(distro)
    config = _config()
    probe = PolicyNode(panda_bundle, config)
    joints = list(probe.joints)
    default = [float(v) for v in probe.spec.array("default_position")] + [0.0] * (len(joints) - len(probe.names))
    target = [0.4, -0.1, 0.5][: probe.observation.command_dim]
    spec = {
        "seconds": 3.0,
        "publish": [
            {
                "topic": "/joint_states",
                "type": "JointState",
                "rate": 50.0,
                "data": {"name": joints, "position": default, "velocity": [0.0] * len(joints)},
            },
            {
                "topic": "/q2real_policy/command",
                "type": "Float64MultiArray",
                "at": 1.0,
                "rate": 10.0,
                "data": {"data": target},
            },
        ],
    }
    with node_running(panda_bundle, config) as node:
        run_peer(distro, spec)
        assert np.allclose(node._task_command, target), node._task_command
        assert node.ticks > 50 and not node.refused


@pytest.mark.parametrize("distro", DISTROS)
def test_imu_cmd_vel_and_an_object_pose_from_a_ros2_peer_reach_the_observation(
    distro, spot_bundle, push_bundle, dds_domain
):
    """sensor_msgs/Imu, geometry_msgs/Twist and geometry_msgs/PoseStamped as an IMU driver, a teleop
    node and a tracker publish them (rclpy, their default QoS) feed the node, and the policy runs."""
    _peer_python(distro)

    def joint_states(bundle) -> dict:
        probe = PolicyNode(bundle, _config())
        names = list(probe.joints)
        default = [float(v) for v in probe.spec.array("default_position")]
        data = {"name": names, "position": default, "velocity": [0.0] * len(names)}
        return {"topic": "/joint_states", "type": "JointState", "rate": 50.0, "data": data}

    tilted = {"x": 0.0, "y": math.sin(0.1), "z": 0.0, "w": math.cos(0.1)}  # pitched by 0.2 rad
    imu = {"orientation": tilted, "angular_velocity": {"x": 0.1, "y": -0.2, "z": 0.3}}
    twist = {"linear": {"x": 0.5, "y": -0.1, "z": 0.0}, "angular": {"x": 0.0, "y": 0.0, "z": 0.4}}
    spec = {
        "seconds": 3.0,
        "publish": [
            joint_states(spot_bundle),
            {"topic": "/imu/data", "type": "Imu", "rate": 200.0, "data": imu},
            {"topic": "/cmd_vel", "type": "Twist", "rate": 20.0, "data": twist},
        ],
    }
    config = _config(require_subscriber=False)
    with node_running(spot_bundle, config) as node:
        samples = _sampled(node, lambda: run_peer(distro, spec))
    running = [values for mode, values in samples if mode == Mode.RUN]
    assert running, f"the policy never ran: {[mode for mode, _ in samples]}"
    values = running[-1]
    np.testing.assert_allclose(values["base_angular_velocity"], [0.1, -0.2, 0.3], atol=1e-12)
    np.testing.assert_allclose(values["projected_gravity"], [math.sin(0.2), 0.0, -math.cos(0.2)], atol=1e-12)
    np.testing.assert_allclose(values["velocity_command"], [0.5, -0.1, 0.4])
    assert not node.refused, node.refused

    pose = {"header": {"frame_id": "world"}, "pose": {"position": {"x": 0.55, "y": 0.1, "z": 0.025}}}
    tracker = {"topic": "/object_pose", "type": "PoseStamped", "rate": 30.0, "data": pose}
    # The push goal the policy reads: a planner's command (the node never runs on a made-up one).
    goal = [0.6, 0.1][: PolicyNode(push_bundle, _config()).observation.command_dim]
    planner = {"topic": "/q2real_policy/command", "type": "Float64MultiArray", "rate": 10.0, "data": {"data": goal}}
    spec = {"seconds": 3.0, "publish": [joint_states(push_bundle), tracker, planner]}
    with node_running(push_bundle, config) as node:
        samples = _sampled(node, lambda: run_peer(distro, spec))
    running = [values for mode, values in samples if mode == Mode.RUN]
    assert running and not node.refused, ([mode for mode, _ in samples], node.refused)
    np.testing.assert_allclose(running[-1]["object_position"], [0.55, 0.1, 0.025])


def _sampled(node: PolicyNode, run) -> list[tuple[Mode, dict]]:
    """(mode, input values) every 50 ms while `run()` runs: once the peer is gone the node falls back."""
    samples: list[tuple[Mode, dict]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            samples.append((node.shield.mode, node.inputs.values(time.monotonic())))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        run()
    finally:
        done.set()
        thread.join()
    return samples
