"""The node's inputs beside joint states: IMU faults drop RUN to DAMP, cmd_vel times out to zero, the
object pose must be fresh and in the trained frame, and every refusal is counted in diagnostics."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from q2real.contracts.schema import BundleError, read_metadata
from q2real.deploy_ros.inputs import Inputs
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.observation import ObservationBuilder
from q2real.deploy_ros.settings import InputsConfig, NodeConfig, TopicConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.safety.flags import Mode
from q2real.safety.shield import ShieldConfig
from tests.deploy_ros.test_node import _rewritten

DT = 0.02
UPRIGHT = msg.Quaternion(x=0.0, y=0.0, z=0.0, w=1.0)


def _imu(orientation: msg.Quaternion = UPRIGHT, gyro=(0.0, 0.0, 0.0)) -> msg.Imu:
    return msg.Imu(orientation=orientation, angular_velocity=msg.Vector3(*gyro))


def _twist(vx: float, vy: float, wz: float) -> msg.Twist:
    return msg.Twist(msg.Vector3(vx, vy, 0.0), msg.Vector3(0.0, 0.0, wz))


def _feed(node: PolicyNode, now: float, imu: msg.Imu | None = None) -> None:
    """One joint state at the default pose (and an IMU reading), received at `now`."""
    node.on_joint_state(node.names, node.shield.default.tolist(), [0.0] * len(node.names), [], received=now)
    if imu is not None:
        assert node.on_imu(imu, received=now) is None


def _running(bundle, imu: bool = True, **inputs) -> tuple[PolicyNode, float]:
    # A stiff hold as the joint-state fallback, to show that an IMU fault damps regardless.
    shield = ShieldConfig(ramp_time=0.1, fallback="hold")
    config = NodeConfig(autostart=True, shield=shield, inputs=InputsConfig(**inputs))
    node = PolicyNode(bundle, config)
    now = 100.0
    for _ in range(10):
        _feed(node, now, _imu() if imu else None)
        node.tick(now)
        now += DT
    return node, now


def test_a_stale_imu_drops_run_to_damp_not_hold_within_its_age_limit(spot_bundle) -> None:
    node, now = _running(spot_bundle, imu_max_age=0.05)
    assert node.shield.mode == Mode.RUN and node.config.shield.fallback == "hold"
    last_imu = now - DT
    modes = []
    while now - last_imu < 0.15:
        _feed(node, now)  # joint states keep coming; the IMU went quiet
        modes.append((now - last_imu, node.tick(now).command.mode))
        now += DT
    damped = [age for age, mode in modes if mode == Mode.DAMP]
    assert damped and damped[0] <= 0.05 + DT + 1e-9, modes
    assert all(mode == Mode.RUN for age, mode in modes if age <= 0.05), modes
    assert all(mode == Mode.DAMP for age, mode in modes if age > 0.05 + DT), modes
    values = node.diagnostics()["values"]
    assert values["inputs.imu.stale"] == "1" and float(values["input_age_ms.imu"]) > 50
    assert "imu_max_age" in node.last_reason


@pytest.mark.parametrize(
    ("reading", "reason"),
    [
        (_imu(msg.Quaternion(x=math.nan, y=0.0, z=0.0, w=1.0)), "nonfinite"),
        (_imu(gyro=(0.0, math.inf, 0.0)), "nonfinite"),
        (_imu(msg.Quaternion(x=0.0, y=0.0, z=0.0, w=0.5)), "not a unit quaternion"),
        (_imu(msg.Quaternion(x=0.0, y=0.0, z=0.0, w=0.0)), "not a unit quaternion"),
        (msg.Imu(orientation=UPRIGHT, orientation_covariance=[-1.0] + [0.0] * 8), "reports none"),
        (_imu(gyro=(1e300, 0.0, 0.0)), "beyond the gyro's 35.0"),  # would be inf in the float32 observation
        (_imu(gyro=(0.0, 0.0, -40.0)), "beyond the gyro's 35.0"),
    ],
)
def test_an_invalid_imu_reading_is_refused_counted_and_drops_run_to_damp(spot_bundle, reading, reason) -> None:
    node, now = _running(spot_bundle)
    assert node.shield.mode == Mode.RUN
    refused = node.on_imu(reading, received=now)
    assert refused is not None and reason in refused and "/imu/data" in refused
    _feed(node, now, _imu())  # a good reading before the tick does not hide the fault
    assert node.tick(now).command.mode == Mode.DAMP
    values = node.diagnostics()["values"]
    assert values["refused.imu"] == "1" and values["inputs.imu.nonfinite_or_invalid"] == "1"
    assert reason in values["last_refusal"]


def test_the_handover_waits_for_the_imu_and_says_so(spot_bundle) -> None:
    node, now = _running(spot_bundle, imu=False)
    assert node.shield.mode == Mode.RAMP, "the policy must not start without its IMU"
    assert "no valid reading on /imu/data" in node.diagnostics()["values"]["waiting_for_inputs"]
    _feed(node, now, _imu())
    node.tick(now)
    assert node.shield.mode == Mode.RUN and "waiting_for_inputs" not in node.diagnostics()["values"]


def _command_term(node: PolicyNode, observation: np.ndarray) -> np.ndarray:
    terms = node.bundle.info.metadata["observation"]["terms"]
    start = sum(t["dim"] for t in terms[: [t["name"] for t in terms].index("command")])
    return observation[0, start : start + 3]


def test_a_velocity_command_is_clipped_to_the_trained_ranges_and_times_out_to_zero(spot_bundle) -> None:
    node, now = _running(spot_bundle, velocity_command_timeout=0.1)
    assert node.on_velocity_command(_twist(0.5, -0.2, 0.3), received=now) is None
    _feed(node, now, _imu())
    np.testing.assert_allclose(_command_term(node, node.tick(now).observation), [0.5, -0.2, 0.3])
    assert node.on_velocity_command(_twist(5.0, -3.0, 2.0), received=now) is None  # beyond forward/lateral/yaw
    _feed(node, now, _imu())
    np.testing.assert_allclose(_command_term(node, node.tick(now).observation), [1.0, -0.5, 1.0])
    garbled = msg.Twist(msg.Vector3(0.5, 0.0, math.inf), msg.Vector3(0.0, 0.0, 0.3))  # a component not observed
    refused = node.on_velocity_command(garbled, received=now)
    assert refused is not None and "/cmd_vel" in refused
    _feed(node, now, _imu())
    tick = node.tick(now)
    np.testing.assert_array_equal(_command_term(node, tick.observation), [0.0, 0.0, 0.0])  # stop now, not at timeout
    assert node.on_velocity_command(_twist(1.0, 0.5, -1.0), received=now) is None
    for _ in range(6):  # 0.12 s without a command
        now += DT
        _feed(node, now, _imu())
        tick = node.tick(now)
    assert tick.command.mode == Mode.RUN, "a missing command means standing still, not a fault"
    np.testing.assert_array_equal(_command_term(node, tick.observation), [0.0, 0.0, 0.0])
    values = node.diagnostics()["values"]
    assert values["inputs.velocity_command.clipped"] == "1" and values["inputs.velocity_command.timeout"] == "1"
    assert values["refused.velocity_command"] == "1"


def _pose(frame: str, x: float = 0.5) -> msg.PoseStamped:
    return msg.PoseStamped(header=msg.Header(frame_id=frame), pose=msg.Pose(msg.Point(x, 0.0, 0.025)))


def test_the_object_pose_must_be_fresh_and_in_the_frame_the_policy_was_trained_in(push_bundle) -> None:
    node, now = _running(push_bundle, imu=False, object_max_age=0.1)
    assert node.on_task_command([0.6, 0.1][: node.observation.command_dim]) is None  # the push goal
    assert node.shield.mode == Mode.RAMP, "the policy must not start before the object is seen"
    refused = node.on_object_pose(_pose("camera_link"), received=now)
    assert refused is not None and "'world'" in refused
    assert node.on_object_pose(_pose("world", math.nan), received=now) is not None
    assert "max_object_distance" in (node.on_object_pose(_pose("world", 1e30), received=now) or "")
    assert node.on_object_pose(_pose("world"), received=now) is None
    _feed(node, now)
    tick = node.tick(now)
    assert tick.command.mode == Mode.RUN
    terms = node.bundle.info.metadata["observation"]["terms"]
    start = sum(t["dim"] for t in terms[: [t["name"] for t in terms].index("cube_position")])
    assert tick.observation is not None
    np.testing.assert_allclose(tick.observation[0, start : start + 3], [0.5, 0.0, 0.025], rtol=1e-6)
    for _ in range(7):
        now += DT
        _feed(node, now)
        tick = node.tick(now)
    assert tick.command.mode == Mode.HOLD, "a stale object falls back as the shield is configured (hold)"
    assert node.diagnostics()["values"]["refused.object_pose"] == "3"


def test_bundles_whose_inputs_the_node_cannot_serve_are_refused(spot_bundle, tmp_path) -> None:
    def terms(meta):
        return {t["name"]: t["source"] for t in meta["observation"]["terms"]}

    cases = [
        (lambda m: m["robot"].update(imu=None), "does not match this machine's spec"),
        (lambda m: terms(m)["command"].update(ranges=[[0.2, 1.0], [-0.5, 0.5], [-1.0, 1.0]]), "pairs around 0"),
        (lambda m: terms(m)["command"].update(ranges=[[-1, 1]]), "3 [lower, upper] pairs"),
        (lambda m: terms(m)["projected_gravity"].update(frame="imu"), "unknown key(s) ['frame']"),
        (lambda m: terms(m)["joint_position"].update(offset=[0.0]), "source.offset: expected 12 finite numbers"),
    ]
    for change, message in cases:
        with pytest.raises(BundleError, match=re.escape(message)):
            PolicyNode(_rewritten(spot_bundle, tmp_path, change))
    builder = ObservationBuilder(read_metadata(spot_bundle), "spot.onnx")
    with pytest.raises(BundleError, match="observes the base IMU, but the bundle's robot has no imu section"):
        Inputs(builder, InputsConfig(), None, TopicConfig(), "spot.onnx")


def test_a_reading_that_arrives_while_the_tick_runs_is_fresh(spot_bundle) -> None:
    """The tick reads its clock before it looks at the inputs: a reading stamped a moment later is the
    freshest there is, not a stale one."""
    node, now = _running(spot_bundle)
    _feed(node, now + 1e-6, _imu())
    assert node.on_velocity_command(_twist(0.5, 0.0, 0.0), received=now + 1e-6) is None
    tick = node.tick(now)
    assert tick.command.mode == Mode.RUN
    np.testing.assert_allclose(_command_term(node, tick.observation), [0.5, 0.0, 0.0])


def test_an_imu_in_another_frame_than_the_configured_one_is_refused(spot_bundle) -> None:
    node, now = _running(spot_bundle, imu=False, imu_frame_id="base_imu")
    assert node.on_imu(_imu(), received=now) is not None, "a reading without the frame must not count"
    assert node.tick(now).command.mode == Mode.RAMP
    reading = _imu()
    reading.header.frame_id = "base_imu"
    _feed(node, now, reading)
    assert node.tick(now).command.mode == Mode.RUN
    reading.header.frame_id = "camera_imu"
    refused = node.on_imu(reading, received=now)
    assert refused is not None and "inputs.imu_frame_id" in refused
    assert node.tick(now).command.mode == Mode.DAMP
