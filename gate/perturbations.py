"""The transfer gate's rows: what the robot will meet, sized for that robot, and whether the run trained for it.

Every robot is perturbed by the same kinds of effect, each sized from its own facts so that it bites:
actuator and PD gains down to 0.7 of nominal (worn or cold actuators, a softer joint controller), one
to three ticks of latency, shoves every 0.5-1.5 s that would change the whole robot's speed by
`PUSH_SPEED` if it were free (force = mass x speed / control period, for one tick), and for an arm its
rated payload at the flange (carried by the actuators: gravity compensation covers the links, not the
load). Mass, friction, damping, centre of mass and observation noise are sized as fractions or in SI
units that mean the same on every robot.

A row is "in range" when the run trained with a range covering it, and "beyond" otherwise; the verdict
takes every required row either way, because the robot does not care what the run trained on. The
"all beyond" row widens every effect past both and is reported, not judged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import mujoco

from q2real.hardware import RobotSpec
from q2real.sim import RandomizationConfig

NEUTRAL = RandomizationConfig()
PUSH_SPEED = 0.3
"""m/s: the speed change a shove would give the whole robot, were it free."""
PUSH_EVERY_S = (0.5, 1.5)
"""Seconds between two shoves, so that even a short episode meets one."""
SCALES = ("mass_scale", "friction_scale", "damping_scale", "actuator_gain_scale", "kp_scale", "kd_scale")


@dataclass(frozen=True)
class Perturbation:
    name: str
    magnitude: str
    """The row's values, as printed in the table."""
    in_range: bool
    """True when the run trained with ranges covering every value."""
    required: bool
    """Part of the verdict (False: the stress row)."""
    randomization: RandomizationConfig


def deployment_effects(spec: RobotSpec, model: mujoco.MjModel) -> dict[str, dict[str, object]]:
    """Effect name -> the `RandomizationConfig` fields it sets, sized for this robot (`model`: the robot alone)."""
    dt = spec.control_period
    push = float(model.body_mass.sum()) * PUSH_SPEED / dt
    every = (round(PUSH_EVERY_S[0] / dt), round(PUSH_EVERY_S[1] / dt))
    effects: dict[str, dict[str, object]] = {
        "mass": {"mass_scale": (0.8, 1.2)},
        "friction": {"friction_scale": (0.5, 1.5)},
        "joint_damping": {"damping_scale": (0.5, 2.0)},
        "actuator_gain": {"actuator_gain_scale": (0.7, 1.0)},
        "com_offset": {"com_offset": 0.01},
        "obs_noise": {"obs_noise_std": 0.01},
        "latency": {"action_latency": (1, 3)},
        "pushes": {"push_force": (0.0, round(push, 1)), "push_interval": every},
    }
    if spec.control_mode == "position":  # a torque robot's PD loop is the policy's
        effects["pd_gains"] = {"kp_scale": (0.7, 1.0), "kd_scale": (0.7, 1.0)}
    if spec.payload is not None:
        effects["payload"] = {"payload": (0.0, spec.payload)}
    return effects


def covered(trained: RandomizationConfig, field: str, value) -> bool:
    """Whether the run's training range of `field` contains `value` (a range or a bound); how often
    shoves come is not a magnitude and does not count."""
    if field == "push_interval":
        return True
    have = getattr(trained, field)
    if isinstance(value, tuple):
        return have[0] <= value[0] and value[1] <= have[1]
    return value <= have


def widened(field: str, value):
    """Past a range: twice its deviation from neutral (latency: one tick more than its top)."""
    if field in SCALES:
        lo, hi = value
        return (max(0.05, 1 - 2 * (1 - lo)), 1 + 2 * (hi - 1))
    if field == "action_latency":
        return (value[1] + 1, value[1] + 1)
    if isinstance(value, tuple):
        return (value[0], 2 * value[1])
    return 2 * value


def _wider(field: str, a, b):
    """The wider of two values of `field` (the run's training range and the deployment size)."""
    if isinstance(a, tuple):
        return (min(a[0], b[0]), max(a[1], b[1]))
    return max(a, b)


def describe(fields: dict[str, object]) -> str:
    def value(v) -> str:
        return f"{v[0]:g}-{v[1]:g}" if isinstance(v, tuple) else f"{v:g}"

    units = {
        "push_force": " N",
        "payload": " kg",
        "action_latency": " ticks",
        "push_interval": " ticks",
        "com_offset": " m",
    }
    return ", ".join(f"{field.removesuffix('_scale')} {value(v)}{units.get(field, '')}" for field, v in fields.items())


def perturbations(trained: RandomizationConfig, spec: RobotSpec, model: mujoco.MjModel) -> list[Perturbation]:
    """The gate's rows for a run on `spec` trained with `trained` randomization."""
    rows = [Perturbation("nominal", "-", True, True, NEUTRAL)]
    together: dict[str, object] = {}
    beyond: dict[str, object] = {}
    for name, fields in deployment_effects(spec, model).items():
        in_range = all(covered(trained, f, v) for f, v in fields.items())
        rows.append(Perturbation(name, describe(fields), in_range, True, dataclasses.replace(NEUTRAL, **fields)))
        together.update(fields)
        beyond.update(
            {f: v if f == "push_interval" else widened(f, _wider(f, getattr(trained, f), v)) for f, v in fields.items()}
        )
    all_in = all(r.in_range for r in rows)
    rows.append(Perturbation("all together", "every row above", all_in, True, dataclasses.replace(NEUTRAL, **together)))
    rows.append(Perturbation("all beyond", describe(beyond), False, False, dataclasses.replace(NEUTRAL, **beyond)))
    return rows
