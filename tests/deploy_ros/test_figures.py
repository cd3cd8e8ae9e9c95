"""The task figures the operator watches, against hand-built observations of real bundles: the tilt and
falls of a legged base, commanded against measured yaw rate, the distance to the target by forward
kinematics (reach) or from the tracked object (push); and how they read on the console."""

from __future__ import annotations

import json
import math

import mujoco
import numpy as np
import pytest

from q2real.contracts.schema import BundleError
from q2real.deploy_ros.figures import TaskFigures, figures_line
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.watch.monitor import status_line
from q2real.hardware import robot_spec
from q2real.hardware.model import load_model


def _show(node: PolicyNode, **terms: list[float]) -> dict[str, str]:
    """Hands the figures a RUN tick whose observation holds `terms` (by source kind), then samples."""
    obs = np.zeros(node.observation.dim, dtype=np.float32)
    for kind, value in terms.items():
        obs[node.observation.spans[kind]] = value
    node.figures.latest = (obs, node.spec.array("default_position"))
    return node.figures.sample()


def _tilted(degrees: float) -> list[float]:
    """Gravity in the base frame of a base pitched by `degrees`."""
    angle = math.radians(degrees)
    return [math.sin(angle), 0.0, -math.cos(angle)]


def test_a_legged_base_reports_tilt_falls_and_its_yaw_rate_against_the_command(spot_bundle) -> None:
    node = PolicyNode(spot_bundle, NodeConfig())
    assert node.figures.fall_tilt == pytest.approx(1.0)  # the task's max_tilt, carried in the bundle
    command = [0.5, -0.1, 0.5]
    values = _show(node, projected_gravity=_tilted(30), base_angular_velocity=[0, 0, 0.4], velocity_command=command)
    assert values["figure.tilt_deg"] == "30.0" and values["figure.falls"] == "0"
    assert (values["figure.cmd_forward"], values["figure.cmd_lateral"], values["figure.cmd_yaw_rate"]) == (
        "0.50",
        "-0.10",
        "0.50",
    )
    assert values["figure.yaw_rate"] == "0.40" and values["figure.yaw_rate_error_mean"] == "0.100"
    for tilt, falls in [(70, 1), (80, 1), (10, 1), (65, 2)]:  # a fall counts once, however long it lasts
        values = _show(node, projected_gravity=_tilted(tilt), base_angular_velocity=[0, 0, 0.5])
        assert values["figure.falls"] == str(falls), tilt
    assert node.figures.sample()["figure.falls"] == "2" and node.figures.tally.samples == 5, "a tick counts once"
    assert values["figure.tilt_max_deg"] == "80.0"
    summary = node.figures.summary()
    assert "5 samples in RUN" in summary and "2 falls (tilt past 57 deg)" in summary and "max 80.0 deg" in summary
    line = figures_line(values)
    assert "tilt 65.0 deg (max 80.0)" in line and "falls 2" in line and "yaw rate 0.50 rad/s" in line


def test_reach_measures_the_end_effector_to_the_target_by_forward_kinematics(panda_bundle) -> None:
    node = PolicyNode(panda_bundle, NodeConfig())
    model = load_model(robot_spec("panda"))
    data = mujoco.MjData(model)
    data.qpos[:7] = robot_spec("panda").array("default_position")
    mujoco.mj_kinematics(model, data)
    end_effector = data.site_xpos[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "end_effector")].copy()
    values = _show(node, command=list(end_effector + [0.024, 0.0, 0.04]))
    assert values["figure.distance_m"] == "0.047" and values["figure.within_share"] == "1.00"  # radius 0.05
    values = _show(node, command=list(end_effector + [0.3, 0.0, 0.4]))
    assert values["figure.distance_m"] == "0.500" and values["figure.distance_min_m"] == "0.047"
    assert values["figure.within_share"] == "0.50"
    assert "tilt" not in figures_line(values) and "distance to target 0.500 m (min 0.047" in figures_line(values)


def test_a_running_node_reports_the_distance_of_its_own_ticks(panda_bundle) -> None:
    """Through the node's tick path: joint states in, the policy running, the figure on /diagnostics."""
    from q2real.safety.shield import ShieldConfig

    node = PolicyNode(panda_bundle, NodeConfig(autostart=True, shield=ShieldConfig(ramp_time=0.1)))
    target = [0.45, 0.0, 0.4]
    assert node.on_task_command(target) is None
    pose = [float(v) for v in node.spec.array("default_position")]
    now = 100.0
    for _ in range(20):
        node.on_joint_state(list(node.joints), pose, [0.0] * len(pose), [], received=now)
        node.tick(now)
        now += node.period
    assert node.shield.mode.name == "RUN"
    model = load_model(robot_spec("panda"))
    data = mujoco.MjData(model)
    data.qpos[:7] = pose
    mujoco.mj_kinematics(model, data)
    end_effector = data.site_xpos[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "end_effector")]
    expected = float(np.linalg.norm(end_effector - target))
    values = node.diagnostics()["values"]
    assert "figure.error" not in values and float(values["figure.distance_m"]) == pytest.approx(expected, abs=1e-3)


def test_push_measures_the_object_to_the_target_on_the_floor(push_bundle) -> None:
    node = PolicyNode(push_bundle, NodeConfig())
    values = _show(node, object_position=[0.5, 0.1, 0.02], command=[0.5, 0.14])
    assert values["figure.distance_m"] == "0.040" and values["figure.within_share"] == "1.00"


def test_a_pendulum_has_no_figures_and_the_console_says_nothing_of_them(pendulum_bundle) -> None:
    node = PolicyNode(pendulum_bundle, NodeConfig())
    obs = np.zeros(node.observation.dim, dtype=np.float32)
    node.figures.latest = (obs, np.zeros(1))
    assert node.figures.sample() == {} and figures_line({}) == ""


@pytest.mark.parametrize(
    ("figures", "message"),
    [
        ({"fall_tilt": 5.0}, "metadata.figures.fall_tilt: expected an angle in (0, pi] rad"),
        ({"within": -1.0}, "metadata.figures.within: expected a finite distance > 0"),
        ({"height": 1.0}, "metadata.figures: expected an object with keys among"),
        (
            {"point": {"kind": "body_point", "joints": ["joint1"], "body": "no_such_body", "offset": [0, 0, 0]}},
            "no body 'no_such_body'",
        ),
        (
            {"point": {"kind": "body_point", "joints": ["elbow"], "body": "link7", "offset": [0, 0, 0]}},
            "metadata.figures.point.joints: expected joints of the bundle's robot",
        ),
    ],
)
def test_a_bad_figures_section_is_refused_by_field(panda_bundle, figures, message) -> None:
    node = PolicyNode(panda_bundle, NodeConfig())
    meta = json.loads(json.dumps(node.bundle.info.metadata)) | {"figures": figures}
    with pytest.raises(BundleError, match="b.onnx: metadata.figures") as err:
        TaskFigures(meta, node.observation, lambda: load_model(robot_spec("panda")), "b.onnx")
    assert message in str(err.value)


def test_the_node_reports_its_figures_on_diagnostics_and_the_monitor_shows_them(spot_bundle) -> None:
    node = PolicyNode(spot_bundle, NodeConfig())
    _show(node, projected_gravity=_tilted(5), base_angular_velocity=[0, 0, 0.2], velocity_command=[0.3, 0, 0.2])
    report = node.diagnostics()
    assert report["values"]["figure.tilt_deg"] == "5.0"

    class Status:
        level, message, hardware_id = 0, "RUN", "spot"
        values = [type("KV", (), {"key": k, "value": v})() for k, v in report["values"].items()]

    assert "figures: tilt 5.0 deg (max 5.0)  falls 0  cmd 0.30 m/s" in status_line(Status, 0.0)
