"""Random robot specs for shield tests, built directly (no YAML or model file needed by the shield)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from q2real.hardware import JointSpec, RobotSpec


def make_spec(rng: np.random.Generator, n: int, mode: str = "position", period: float = 0.02) -> RobotSpec:
    joints = []
    for i in range(n):
        if rng.random() < 0.2:
            lo, hi = -np.inf, np.inf
            default = float(rng.uniform(-1, 1))
        else:
            lo = float(rng.uniform(-3, 0.5))
            hi = lo + float(rng.uniform(0.2, 4))
            default = float(rng.uniform(lo, hi))
        velocity = float(rng.uniform(0.5, 20))
        joints.append(
            JointSpec(
                name=f"j{i}",
                position_limits=(lo, hi),
                velocity_limit=velocity,
                effort_limit=float(rng.uniform(1, 300)),
                default_position=default,
                kp=float(rng.uniform(5, 500)) if mode == "position" else 0.0,
                kd=float(rng.uniform(0, 20)) if mode == "position" else 0.0,
                # Half stop at once; half within 0.02-1 s from the velocity limit, as a spec may say.
                stop_deceleration=velocity / float(rng.uniform(0.02, 1.0)) if rng.random() < 0.5 else math.inf,
            )
        )
    return RobotSpec(f"random{n}", Path("unused.xml"), mode, period, tuple(joints), Path("random.yaml"))


@pytest.fixture
def spec_factory():
    return make_spec
