from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np
import pytest
import yaml

from q2real.hardware import SpecError, load_spec, robot_spec
from q2real.hardware.model import load_model, substeps
from q2real.hardware.spec import HARDWARE_DIR

SHIPPED = sorted(p.parent.name for p in HARDWARE_DIR.glob("*/robot.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_specs_load_and_constrain_their_models(name: str) -> None:
    spec = robot_spec(name)
    model = load_model(spec)
    assert substeps(spec, model) >= 1
    for joint in spec.joints:
        jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, joint.name)
        lo, hi = joint.position_limits
        if np.isfinite(lo):
            assert tuple(model.jnt_range[jid]) == (lo, hi) and model.jnt_limited[jid]
        act = [a for a in range(model.nu) if model.actuator_trnid[a, 0] == jid][0]
        assert tuple(model.actuator_forcerange[act]) == (-joint.effort_limit, joint.effort_limit)
    assert len(spec.sha256) == 64


def _write(tmp_path: Path, data: dict) -> Path:
    (tmp_path / "model.xml").write_text((HARDWARE_DIR / "cartpole" / "model.xml").read_text())
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _good() -> dict:
    return yaml.safe_load((HARDWARE_DIR / "cartpole" / "robot.yaml").read_text())


def _set(data: dict, dotted: str, value) -> dict:
    node = data
    keys = dotted.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("control_period", _DELETE, "missing required field 'control_period'"),
        ("control_mode", "velocity", "control_mode: expected 'torque' or 'position'"),
        ("control_period", 0.0123, "control_period: 0.0123 s is not a whole multiple"),
        ("model", "missing.xml", "model: file"),
        ("gains", 1, "unknown field(s) ['gains']"),
        ("joints", [], "joints: expected a non-empty list"),
        ("joints.0.velocity_limit", -1.0, "joints[0](slider).velocity_limit: expected a finite number > 0"),
        ("joints.0.effort_limit", "ten", "joints[0](slider).effort_limit: expected a number"),
        ("joints.0.position_limits", [1.0, -1.0], "position_limits: lower 1.0 must be below upper -1.0"),
        ("joints.0.default_position", 5.0, "default_position: 5.0 lies outside position_limits"),
        ("joints.0.name", "elbow", "joints.elbow: no joint of that name"),
        ("joints.0.kp", -3.0, "kp: expected a finite number >= 0"),
        ("joints.0.stiffness", 3.0, "unknown field(s) ['stiffness']"),
        ("joints.0.stop_deceleration", 0.0, "stop_deceleration: expected a number > 0 (inf: stop at once)"),
        ("joints.0.stop_deceleration", -5.0, "stop_deceleration: expected a number > 0"),
        ("joints.0.stop_deceleration", "fast", "stop_deceleration: expected a number"),
        ("joints.0.stop_deceleration", 1e-300, "a stop may take at most 1 s (expected >= "),
    ],
)
def test_bad_specs_name_file_and_field(tmp_path: Path, field: str, value, message: str) -> None:
    path = _write(tmp_path, _set(_good(), field, value))
    with pytest.raises(SpecError) as err:
        spec = load_spec(path)
        substeps(spec, load_model(spec))
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_position_mode_requires_gains_and_writes_them_into_the_model(tmp_path: Path) -> None:
    data = _set(_good(), "control_mode", "position")
    with pytest.raises(SpecError, match=r"kp: position-controlled joints need kp > 0"):
        load_spec(_write(tmp_path, data))
    data["joints"][0].update(kp=40.0, kd=2.0)
    model = load_model(load_spec(_write(tmp_path, data)))
    assert model.actuator_gainprm[0, 0] == 40.0
    assert tuple(model.actuator_biasprm[0, :3]) == (0.0, -40.0, -2.0)


def test_unknown_robot_lists_shipped_specs() -> None:
    with pytest.raises(SpecError, match="shipped specs: .*cartpole"):
        robot_spec("t800")


@pytest.mark.parametrize("name", ["../pendulum", "/etc/passwd", "..", "pendulum/../panda", "a" * 65, ""])
def test_robot_names_are_folder_names_never_paths(name: str) -> None:
    with pytest.raises(SpecError, match="expected a robot name of letters, digits"):
        robot_spec(name)


def _spot_with_imu(tmp_path: Path, imu) -> Path:
    data = yaml.safe_load((HARDWARE_DIR / "spot" / "robot.yaml").read_text())
    data["model"] = str(HARDWARE_DIR / "spot" / "model.xml")
    data["imu"] = imu
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("imu", "message"),
    [
        ({"site": "imu", "rotation": [1.0, 0.0, 0.0, 0.5]}, "imu.rotation: expected a unit quaternion"),
        ({"site": "imu", "rotation": [1.0, 0.0, 0.0]}, "imu.rotation: expected a quaternion"),
        ({"site": "imu", "rotation": [1.0, 0.0, 0.0, float("nan")]}, "imu.rotation[3]: expected a number, got NaN"),
        ({"site": "imu"}, "missing required field 'rotation'"),
        ({"site": "imu", "rotation": [1, 0, 0, 0], "frame": "x"}, "unknown field(s) ['frame']"),
        ({"site": "gyro", "rotation": [1, 0, 0, 0]}, "imu.site: no site 'gyro'"),
        ({"site": "FR_center", "rotation": [1, 0, 0, 0]}, "not on the floating base"),
    ],
)
def test_a_bad_imu_mounting_is_refused(tmp_path: Path, imu, message: str) -> None:
    path = _spot_with_imu(tmp_path, imu)
    with pytest.raises(SpecError) as err:
        load_model(load_spec(path))
    assert str(path) in str(err.value) and message in str(err.value)


def test_the_imu_mounting_is_written_into_the_model_and_travels_in_the_bundle(tmp_path: Path) -> None:
    from q2real.contracts.schema import robot_from_metadata, robot_metadata
    from q2real.hardware.spec import differences

    rotation = [0.0, 0.0, 0.0, 1.0]  # mounted upside down about z: yaw by pi
    spec = load_spec(_spot_with_imu(tmp_path, {"site": "imu", "rotation": rotation}))
    model = load_model(spec)
    site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "imu")
    np.testing.assert_array_equal(model.site_quat[site], rotation)
    meta = {"control_period": spec.control_period, "action": {"dim": spec.num_joints}, "robot": robot_metadata(spec)}
    assert robot_from_metadata(meta, "b.onnx").imu == spec.imu
    assert differences(spec, robot_spec("spot")) == [f"imu: {spec.imu} vs {robot_spec('spot').imu}"]


def test_the_stop_deceleration_is_read_per_joint_and_travels_in_the_bundle(tmp_path: Path) -> None:
    from q2real.contracts.schema import BundleError, robot_from_metadata, robot_metadata
    from q2real.hardware.spec import differences

    data = _good()
    assert load_spec(_write(tmp_path, data)).joints[0].stop_deceleration == float("inf"), "default: at once"
    data["joints"][0]["stop_deceleration"] = 15.0
    spec = load_spec(_write(tmp_path, data))
    assert spec.joints[0].stop_deceleration == 15.0
    meta = {"control_period": spec.control_period, "action": {"dim": spec.num_joints}, "robot": robot_metadata(spec)}
    assert meta["robot"]["stop_decelerations"] == [15.0]
    assert differences(robot_from_metadata(meta, "b.onnx"), spec) == []
    del meta["robot"]["stop_decelerations"]  # a bundle exported before stops had a deceleration
    assert robot_from_metadata(meta, "b.onnx").joints[0].stop_deceleration == float("inf")
    for bad in ([15.0, 15.0], [-1.0], ["15"], [float("nan")], 15.0, [1e-9]):
        meta["robot"]["stop_decelerations"] = bad
        with pytest.raises(BundleError, match=r"b.onnx: metadata.robot.stop_decelerations"):
            robot_from_metadata(meta, "b.onnx")


@pytest.mark.parametrize("name", SHIPPED)
def test_the_rate_window_is_the_velocity_limit_times_the_control_period(name: str) -> None:
    """The shield, its clamps in the sim and stepped actions read this one window (they each computed it)."""
    spec = robot_spec(name)
    expected = np.array([joint.velocity_limit for joint in spec.joints]) * spec.control_period
    assert spec.rate_window.dtype == np.float64
    assert np.array_equal(spec.rate_window, expected)
