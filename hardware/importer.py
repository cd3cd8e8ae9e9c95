"""Turn a robot MJCF with meshes into the self-contained, MJX-friendly model q2real commits.

Robot models on PyPI (robosuite's Panda, Spot and GR1) collide through meshes, and MJX has no
cylinder-mesh or mesh-mesh pairs worth using for a batch of thousands. The importer keeps the
kinematics and the inertia of the source exactly (every body's compiled mass, centre of mass and
inertia are written explicitly, so they no longer depend on the meshes), replaces each collision
mesh by a primitive the MuJoCo compiler fits to it, drops the visual meshes, and puts one actuator
per joint of the kind the robot spec asks for. The result loads offline, without the source
package, on both backends; limits and gains are still written into it by the robot spec.

    python -m q2real.hardware.importer panda      # -> hardware/panda/model.xml

A robot can also be derived from one already imported, with some joints welded at their default
position (`DERIVED`): GR1 with its head and arms rigid, so that a standing policy commands only the
waist and legs. Its model and spec are both written from the base robot's, so each fact stays
written once, in the base robot's files.

    python -m q2real.hardware.importer gr1_legs   # -> hardware/gr1_legs/{model.xml,robot.yaml}
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import mujoco
import numpy as np
import yaml

from q2real.hardware.spec import HARDWARE_DIR, SpecError, robot_spec

_MESH = mujoco.mjtGeom.mjGEOM_MESH


@dataclass(frozen=True)
class Source:
    """Where a robot comes from and what the importer adds around it."""

    package: str
    path: str
    """MJCF path inside the package."""
    actuator: str
    """`motor` (torque control) or `position` (PD on the joint)."""
    primitive: dict[str, str] = field(default_factory=dict)
    """Fitted primitive per collision mesh name (`capsule` unless listed: `box`, `sphere`)."""
    base_height: float | None = None
    """Free-floating robots: height of the root body above the floor in the written keyframe."""
    sites: dict[str, tuple[str, tuple[float, float, float]]] = field(default_factory=dict)
    """Sites to add, name -> (body, position), for sensors the tasks read."""
    timestep: float = 0.002
    integrator: str = "euler"
    """Euler (implicit in joint damping) keeps MJX and MuJoCo together: their implicitfast integrators
    differ once an actuator saturates at its force limit (MuJoCo drops the clamped actuator's velocity
    derivative, MJX does not); measured 1.5e-2 rad/s apart after 10 Panda steps, 1e-6 with Euler."""
    armature: float = 0.0
    """Reflected rotor inertia (kg m^2) of every actuated joint, where the source leaves it out."""
    gravity_compensation: bool = False
    """Arms whose controller cancels gravity (Franka's does): every body gets `gravcomp=1`."""


SOURCES = {
    "panda": Source(
        "robosuite",
        "models/assets/robots/panda/robot.xml",
        "position",
        sites={"end_effector": ("right_hand", (0.0, 0.0, 0.0))},
        gravity_compensation=True,
    ),
    "spot": Source(
        "robosuite",
        "models/assets/robots/spot/robot.xml",
        "position",
        base_height=0.52,
        sites={"imu": ("body", (0.0, 0.0, 0.0))},
        timestep=0.004,
        armature=0.02,
    ),
    "gr1": Source(
        "robosuite",
        "models/assets/robots/gr1/robot.xml",
        "position",
        base_height=0.95,
        sites={"imu": ("base", (0.0, 0.0, 0.0))},
        timestep=0.002,
        armature=0.02,
    ),
}


@dataclass(frozen=True)
class Derived:
    """A robot made from an imported one by welding joints at their default position."""

    base: str
    welded: tuple[str, ...]
    summary: str
    """What the robot is, opening the derived spec's header comment (may span lines, each after `# `)."""


_ARM_JOINTS = (
    "shoulder_pitch",
    "shoulder_roll",
    "shoulder_yaw",
    "elbow_pitch",
    "wrist_yaw",
    "wrist_roll",
    "wrist_pitch",
)
_GR1_ARMS = tuple(f"{side}_{joint}" for side in ("r", "l") for joint in _ARM_JOINTS)
DERIVED = {
    "gr1_legs": Derived(
        "gr1",
        ("head_yaw", "head_roll", "head_pitch", *_GR1_ARMS),
        "Fourier GR1 with its head and arms welded at gr1's default pose: the waist and legs are actuated "
        "(15 joints).\n# On the robot, the arms are held at that pose by their own controller.",
    ),
}


def source_path(source: Source) -> Path:
    found = importlib.util.find_spec(source.package)
    if found is None or found.origin is None:
        raise ModuleNotFoundError(
            f"importing a model from {source.package} needs it installed (pip install {source.package})"
        )
    return Path(found.origin).parent / source.path


def _collision(model: mujoco.MjModel, geom: int) -> bool:
    return bool(model.geom_contype[geom] or model.geom_conaffinity[geom])


def convert(source: Source) -> str:
    """MJCF text of the imported robot: primitives for collision, explicit inertia, one actuator per joint."""
    path = source_path(source)
    spec = mujoco.MjSpec.from_file(str(path))
    spec.compiler.fitaabb = True
    original = spec.compile()
    geoms = list(spec.geoms)
    for i, geom in enumerate(geoms):
        geom.name = geom.name or f"geom_{i}"
    # Pass 1: fit primitives to the collision meshes and remember each body's true inertia.
    for i, geom in enumerate(geoms):
        if geom.type == _MESH and _collision(original, i):
            geom.type = getattr(mujoco.mjtGeom, f"mjGEOM_{source.primitive.get(geom.meshname, 'capsule').upper()}")
    fitted = spec.compile()
    for body in spec.bodies[1:]:
        b = mujoco.mj_name2id(original, mujoco.mjtObj.mjOBJ_BODY, body.name)
        body.explicitinertial = True
        body.mass = original.body_mass[b]
        body.ipos = original.body_ipos[b]
        body.iquat = original.body_iquat[b]
        body.inertia = original.body_inertia[b]
        body.gravcomp = float(source.gravity_compensation)
    # Pass 2: freeze the fitted primitives, delete visual geoms and every mesh, material and camera.
    visual = [g for g in geoms if g.type == _MESH or g.parent.name == "world"]  # and the source's own floor
    for i, geom in enumerate(geoms):
        g = mujoco.mj_name2id(fitted, mujoco.mjtObj.mjOBJ_GEOM, geom.name)
        if geom.meshname and geom.type != _MESH:
            geom.meshname = ""
            geom.size, geom.pos, geom.quat = fitted.geom_size[g], fitted.geom_pos[g], fitted.geom_quat[g]
            geom.fromto = [np.nan] * 6
        # Robot geoms touch the world (floor, objects) but not each other: fitted primitives of
        # neighbouring links overlap where the meshes did not.
        geom.contype, geom.conaffinity = (1, 0) if _collision(original, i) else (0, 0)
        geom.condim = max(geom.condim, 3)  # frictionless feet (GR1's condim 1) cannot stand
        geom.material = ""
        geom.rgba = (0.7, 0.7, 0.75, 1.0)
        geom.mass, geom.density = 0.0, 0.0
    for element in [*visual, *spec.meshes, *spec.cameras, *spec.actuators]:
        spec.delete(element)
    for name, (body, pos) in source.sites.items():
        spec.body(body).add_site(name=name, pos=pos, size=[0.01] * 3, group=3)
    joints = [j for j in spec.joints if j.type in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE)]
    for joint in joints:
        joint.armature = max(joint.armature, source.armature)
        act = spec.add_actuator(name=joint.name, target=joint.name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        if source.actuator == "position":  # gains come from robot.yaml when the model is loaded
            act.gaintype, act.biastype = mujoco.mjtGain.mjGAIN_FIXED, mujoco.mjtBias.mjBIAS_AFFINE
            act.gainprm[0], act.biasprm[:3] = 1.0, (0.0, -1.0, 0.0)
    spec.option.gravity = np.array([0.0, 0.0, -9.81])
    spec.option.timestep = source.timestep
    spec.option.integrator = getattr(mujoco.mjtIntegrator, f"mjINT_{source.integrator.upper()}")
    spec.option.solver = mujoco.mjtSolver.mjSOL_NEWTON
    spec.option.iterations, spec.option.ls_iterations = 4, 8
    spec.option.cone = mujoco.mjtCone.mjCONE_PYRAMIDAL
    spec.option.impratio = 1.0
    spec.worldbody.add_geom(
        name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=(0, 0, 0.05), rgba=(0.3, 0.3, 0.3, 1), conaffinity=1
    )
    spec.worldbody.add_light(pos=(0, 0, 3), dir=(0, 0, -1))
    if source.base_height is not None:
        spec.body(spec.bodies[1].name).pos = np.array([0.0, 0.0, source.base_height])
    spec.compile()
    header = f"<!-- Imported by q2real.hardware.importer from {source.package}: {source.path}. -->\n"
    return header + spec.to_xml()


def derive(name: str, derived: Derived) -> tuple[str, str]:
    """MJCF and spec YAML text of `derived`: each welded joint's body turned to the joint's default
    position about its axis, then the joint and its actuator deleted, so the link rides rigidly on its
    parent exactly where the base robot's default pose puts it. The spec keeps the base robot's
    entries for the joints that remain."""
    base = robot_spec(derived.base)
    defaults = {j.name: j.default_position for j in base.joints}
    unknown = sorted(set(derived.welded) - set(defaults))
    if unknown:
        raise SpecError(f"{base.source}: no joint(s) {unknown} to weld")
    spec = mujoco.MjSpec.from_file(str(base.model_path))
    for joint_name in derived.welded:
        joint = spec.joint(joint_name)
        if np.any(joint.pos):  # turning the body about its own origin is then not the joint's motion
            raise SpecError(f"{base.model_path}: joint {joint_name} is not at its body's origin")
        turn, quat = np.zeros(4), np.zeros(4)
        mujoco.mju_axisAngle2Quat(turn, np.asarray(joint.axis, dtype=float), defaults[joint_name])
        mujoco.mju_mulQuat(quat, np.asarray(joint.parent.quat, dtype=float), turn)
        joint.parent.quat = quat
        spec.delete(joint)
    for actuator in [a for a in spec.actuators if a.target in derived.welded]:
        spec.delete(actuator)
    spec.compile()
    welded = ", ".join(derived.welded)
    model_header = f"<!-- Derived by q2real.hardware.importer from {derived.base}: {welded} welded. -->\n"
    data = yaml.safe_load(base.source.read_text())
    data["name"] = name
    data["joints"] = [j for j in data["joints"] if j["name"] not in derived.welded]
    spec_header = (
        f"# {derived.summary}\n# Derived by q2real.hardware.importer from hardware/{derived.base}/robot.yaml: "
        f"edit that file and run `python -m q2real.hardware.importer {name}`.\n"
    )
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
    return model_header + spec.to_xml(), spec_header + body


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("robot", choices=sorted([*SOURCES, *DERIVED]))
    parser.add_argument("--out", type=Path, help="model file to write (default hardware/ROBOT/model.xml)")
    args = parser.parse_args(argv)
    out = args.out or HARDWARE_DIR / args.robot / "model.xml"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.robot in DERIVED:
        model_text, spec_text = derive(args.robot, DERIVED[args.robot])
        out.write_text(model_text)
        (out.parent / "robot.yaml").write_text(spec_text)
    else:
        out.write_text(convert(SOURCES[args.robot]))
    model = mujoco.MjModel.from_xml_path(str(out))
    print(f"wrote {out}: {model.nbody - 1} bodies, {model.njnt} joints, {model.ngeom} geoms, {model.nu} actuators")


if __name__ == "__main__":
    main()
