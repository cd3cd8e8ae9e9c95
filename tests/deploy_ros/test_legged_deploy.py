"""Every robot task leaves the simulator: the legged, humanoid and object-tracking bundles start, run
and stop cleanly under `q2real deploy --sim`, fed by the sim robot's IMU, a cmd_vel publisher and the
object tracker over DDS. The return is not the point here (untrained policies; Spot does not walk at
CPU training budgets); the transfer gate measures it."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter

import numpy as np
import pytest

from q2real.cli.main import main
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import SENSOR_QOS, Endpoints
from q2real.gate.sim_robot import GROUND_TRUTH_TOPIC
from q2real.safety.flags import Mode
from q2real.safety.shield import ShieldConfig
from tests.deploy_ros.conftest import export_fresh_agent
from tests.deploy_ros.test_dds_loop import running

pytestmark = pytest.mark.slow  # real-time DDS against the sim robot process


class Wire:
    """Counts every message on the robot's topics and keeps the node's modes and commands."""

    def __init__(self, endpoints: Endpoints):
        self.counts: Counter[str] = Counter()
        self.modes: list[str] = []
        self.running: dict[str, str] = {}
        """The key/values of the last report in RUN."""
        self.commands: list[list[float]] = []
        self.stamps: list[float] = []
        topics = [("/joint_states", msg.JointState), ("/imu/data", msg.Imu), ("/object_pose", msg.PoseStamped)]
        topics.append((GROUND_TRUTH_TOPIC, msg.Odometry))
        self.readers = [endpoints.reader(t, kind, self._count(t), SENSOR_QOS) for t, kind in topics]
        self.readers.append(
            endpoints.reader("/forward_command_controller/commands", msg.Float64MultiArray, self._command)
        )
        self.readers.append(endpoints.reader("/diagnostics", msg.DiagnosticArray, self._diagnostics))

    def _count(self, topic: str):
        def on_message(m) -> None:
            self.counts[topic] += 1
            if topic == "/imu/data":
                self.stamps.append(time.monotonic())

        return on_message

    def _command(self, m) -> None:
        self.commands.append(list(m.data))

    def _diagnostics(self, m) -> None:
        self.modes.append(m.status[0].message.split(":")[0])
        if self.modes[-1] == "RUN":
            self.running = {kv.key: kv.value for kv in m.status[0].values}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("task", ["spot_joystick", "gr1_stand", "gr1_legs_stand", "panda_push"])
def test_a_bundle_of_every_input_kind_starts_runs_and_stops_on_the_sim_robot(task, participant, tmp_path, capfd):
    bundle = export_fresh_agent(task, tmp_path / f"{task}.onnx")
    endpoints = participant("observer")
    wire = Wire(endpoints)
    stop = threading.Event()
    publisher = None
    if task == "spot_joystick":
        writer = endpoints.writer("/cmd_vel", msg.Twist)
        twist = msg.Twist(msg.Vector3(0.5, 0.0, 0.0), msg.Vector3(0.0, 0.0, 0.2))
        publisher = threading.Thread(target=lambda: [writer.write(twist) for _ in iter(lambda: stop.wait(0.05), True)])
        publisher.start()
    try:
        # The age limit is the pipeline's, not the point here: 0.2 s so a stalled process on a loaded
        # machine does not read as an IMU fault (the test below holds the default limit).
        # A push runs two of its 4 s episodes: the second, run by the policy throughout, is judged.
        duration = "9" if task == "panda_push" else "4"
        args = ["--duration", duration, "autostart=true", "shield.ramp_time=0.2", "inputs.imu_max_age=0.2"]
        code = main(["deploy", str(bundle), "--sim", *args])
    finally:
        stop.set()
        if publisher is not None:
            publisher.join()
    out = capfd.readouterr().out  # the node's console and the sim robot's
    assert code == 0 and "stopped (duration) after" in out, out
    assert "RUN" in wire.modes, f"the node never handed over to the policy: {wire.modes[-5:]} ({out[-2000:]})"
    # From the handover to the stop: RUN only, then the stop's reports (the e-stop tick's and the last one).
    after = "".join("R" if mode == "RUN" else "E" if mode == "ESTOP" else "x" for mode in wire.modes)
    after = after[after.index("R") :]
    assert after.rstrip("E") == "R" * len(after.rstrip("E")), (
        f"an input fault while every stream was published: {wire.modes}"
    )
    ages = {k.split(".")[1]: float(v) for k, v in wire.running.items() if k.startswith("input_age_ms.")}
    expected = {
        "spot_joystick": {"imu", "velocity_command"},
        "gr1_stand": {"imu"},
        "gr1_legs_stand": {"imu"},
        "panda_push": {"object_pose"},
    }
    assert set(ages) == expected[task] and max(ages.values()) < 200, ages  # every stream arrives while running
    commands = np.array(wire.commands)
    assert len(commands) > 100 and np.isfinite(commands).all()
    assert wire.counts["/joint_states"] > 150
    if task == "panda_push":
        assert wire.counts["/object_pose"] > 60 and wire.counts["/imu/data"] == 0
        # The sim robot read the node's RUN on ~/mode and judged the episode the policy ran through.
        assert re.search(r"episode 2 (succeeded|failed) \([01] of 1 so far\)", out), out[-3000:]
        summary = re.search(r"sim robot: (\d+) of (\d+) judged episodes succeeded \((\d+) begun\)", out)
        assert summary and 1 <= int(summary[2]) < int(summary[3]), out[-3000:]
    else:
        assert wire.counts["/imu/data"] > 4 * wire.counts["/joint_states"] - 50, wire.counts  # 200 Hz vs 50 Hz
        assert wire.counts[GROUND_TRUTH_TOPIC] > 150
        gaps = np.diff(wire.stamps)
        assert np.median(gaps) == pytest.approx(0.005, abs=0.002)
    assert wire.modes[-1] == "ESTOP", "the node's last command is its stop"


@pytest.mark.timeout(120)
def test_an_imu_slower_than_its_age_limit_drops_the_running_policy_to_damp(spot_bundle, participant) -> None:
    """Over DDS: an IMU at 4 Hz is fresh for 50 ms after each reading, so the policy may take over, and
    it is dropped to DAMP (not HOLD, the configured fallback) once a reading is older than 50 ms."""
    config = NodeConfig(autostart=True, startup_timeout=30.0, shield=ShieldConfig(ramp_time=0.2, fallback="hold"))
    with running(spot_bundle, config, robot="spot", extra=["--imu-rate", "4"]) as (node, _, _, errors):
        deadline = time.monotonic() + 30
        while node.shield.mode not in (Mode.DAMP, Mode.HOLD, Mode.ESTOP) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not errors, errors
        assert node.shield.mode == Mode.DAMP and config.shield.fallback == "hold", node.last_reason
        assert "imu_max_age" in node.last_reason and node.inputs.events["imu.stale"] >= 1
