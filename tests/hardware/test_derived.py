"""Robots derived from an imported one by welding joints (`q2real.hardware.importer.DERIVED`)."""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np
import pytest

from q2real.hardware import SpecError, robot_spec
from q2real.hardware.importer import DERIVED, Derived, derive
from q2real.hardware.model import load_model
from q2real.hardware.spec import HARDWARE_DIR, differences


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_committed_files_are_what_the_importer_writes(name: str) -> None:
    """The derived files are never edited by hand: regenerating them changes nothing."""
    model_text, spec_text = derive(name, DERIVED[name])
    assert (HARDWARE_DIR / name / "model.xml").read_text() == model_text
    assert (HARDWARE_DIR / name / "robot.yaml").read_text() == spec_text


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_the_kept_joints_carry_the_base_robots_facts(name: str) -> None:
    derived, base = robot_spec(name), robot_spec(DERIVED[name].base)
    kept = tuple(j for j in base.joints if j.name not in DERIVED[name].welded)
    assert derived.joint_names == [j.name for j in kept]
    assert differences(derived, dataclasses.replace(base, name=name, joints=kept)) == []


def _posed(name: str) -> tuple[mujoco.MjModel, mujoco.MjData]:
    spec = robot_spec(name)
    model = load_model(spec)
    data = mujoco.MjData(model)
    for joint in spec.joints:
        data.qpos[model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, joint.name)]] = (
            joint.default_position
        )
    mujoco.mj_kinematics(model, data)
    return model, data


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_welded_links_sit_where_the_base_robots_default_pose_puts_them(name: str) -> None:
    model, data = _posed(name)
    base_model, base_data = _posed(DERIVED[name].base)
    assert model.nu == base_model.nu - len(DERIVED[name].welded)
    assert model.nbody == base_model.nbody
    for body in range(1, model.nbody):  # MJCF keeps 6 significant digits of each body's quaternion
        other = mujoco.mj_name2id(base_model, mujoco.mjtObj.mjOBJ_BODY, model.body(body).name)
        np.testing.assert_allclose(data.xpos[body], base_data.xpos[other], atol=1e-5)
        np.testing.assert_allclose(data.xmat[body], base_data.xmat[other], atol=1e-5)
    np.testing.assert_allclose(model.body_subtreemass[0], base_model.body_subtreemass[0], rtol=1e-12)


def test_welding_a_joint_the_base_robot_lacks_is_refused() -> None:
    with pytest.raises(SpecError, match=r"no joint\(s\) \['elbow'\] to weld"):
        derive("gr1_bad", Derived("gr1", ("head_yaw", "elbow"), "bad"))
