"""A robot's MuJoCo model: compiled from its MJCF with the spec's limits and gains written in.

Kept apart from the robot facts (`q2real.hardware.spec`) so that the shield, the bundle contracts
and a robot computer read a spec without MuJoCo installed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import mujoco

from q2real.hardware.spec import RobotSpec, SpecError


def load_model(spec: RobotSpec, scene: Callable[[mujoco.MjSpec], None] | None = None) -> mujoco.MjModel:
    """Compile the robot's MJCF and write this spec's limits and gains into it.

    `scene` may add what a task needs around the robot (objects, sites, sensors) before compiling;
    it must not change the robot itself.
    """
    try:
        mjspec = mujoco.MjSpec.from_file(str(spec.model_path))
        if scene is not None:
            scene(mjspec)
        model = mjspec.compile()
    except ValueError as err:
        raise SpecError(f"{spec.source}: model: {spec.model_path} does not compile: {err}") from err
    apply_to_model(spec, model)
    return model


def substeps(spec: RobotSpec, model: mujoco.MjModel) -> int:
    """Physics steps per control period; the period must be a whole number of timesteps."""
    ratio = spec.control_period / model.opt.timestep
    if abs(ratio - round(ratio)) > 1e-6 or round(ratio) < 1:
        raise SpecError(
            f"{spec.source}: control_period: {spec.control_period} s is not a whole multiple of the "
            f"model timestep {model.opt.timestep} s"
        )
    return round(ratio)


def actuator_for_joint(model: mujoco.MjModel, joint_id: int) -> int | None:
    """Index of the actuator that drives `joint_id` directly, or None."""
    for act in range(model.nu):
        if model.actuator_trntype[act] == mujoco.mjtTrn.mjTRN_JOINT and model.actuator_trnid[act, 0] == joint_id:
            return act
    return None


def apply_to_model(spec: RobotSpec, model: mujoco.MjModel) -> None:
    """Make the compiled model obey the spec: joint ranges, actuator force limits and PD gains.

    The MJCF supplies geometry and inertia; the limits a robot is allowed to use come from the spec
    alone, so editing the spec is enough to change what sim, shield and deploy enforce.
    """
    for joint in spec.joints:
        jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, joint.name)
        if jid < 0:
            raise SpecError(f"{spec.source}: joints.{joint.name}: no joint of that name in {spec.model_path.name}")
        act = actuator_for_joint(model, jid)
        if act is None:
            raise SpecError(f"{spec.source}: joints.{joint.name}: no actuator drives it in {spec.model_path.name}")
        lo, hi = joint.position_limits
        bounded = math.isfinite(lo) and math.isfinite(hi)
        model.jnt_limited[jid] = int(bounded)
        if bounded:
            model.jnt_range[jid] = (lo, hi)
        model.actuator_forcelimited[act] = 1
        model.actuator_forcerange[act] = (-joint.effort_limit, joint.effort_limit)
        if spec.control_mode == "position":
            # MuJoCo position actuator: force = kp * ctrl - kp * q - kd * qdot (gear 1).
            model.actuator_gainprm[act, 0] = joint.kp
            model.actuator_biasprm[act, :3] = (0.0, -joint.kp, -joint.kd)
            model.actuator_ctrllimited[act] = int(bounded)
            if bounded:
                model.actuator_ctrlrange[act] = (lo, hi)
        else:
            gear = model.actuator_gear[act, 0]
            model.actuator_ctrllimited[act] = 1
            model.actuator_ctrlrange[act] = (-joint.effort_limit / gear, joint.effort_limit / gear)
    if spec.imu is not None:
        site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, spec.imu.site)
        if site < 0:
            raise SpecError(f"{spec.source}: imu.site: no site '{spec.imu.site}' in {spec.model_path.name}")
        body = model.site_bodyid[site]
        joint = model.body_jntadr[body]
        if joint < 0 or model.jnt_type[joint] != mujoco.mjtJoint.mjJNT_FREE:
            raise SpecError(
                f"{spec.source}: imu.site: '{spec.imu.site}' is not on the floating base (the body with the free joint)"
            )
        model.site_quat[site] = spec.imu.rotation
        model.site_sameframe[site] = 0  # the compiler's shortcut for a site in its body's frame no longer holds
