"""The sim robot's ground-truth figures of a floating base, on a body moved by hand: velocities in the
base's own frame, the distance travelled, a line per period beside the command, and the run's summary."""

from __future__ import annotations

import math

import mujoco
import numpy as np

from q2real.gate.ground_truth import GroundTruth

BASE = '<mujoco><worldbody><body name="base"><freejoint/><geom size="0.1"/></body></worldbody></mujoco>'


def test_a_base_walking_sideways_in_the_world_reports_forward_in_its_own_frame() -> None:
    model = mujoco.MjModel.from_xml_string(BASE)
    data = mujoco.MjData(model)
    yaw = math.pi / 2  # facing +y: walking along +y is forward
    data.qpos[:7] = [0.0, 0.0, 0.5, math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]
    data.qvel[:6] = [0.0, 0.5, 0.0, 0.0, 0.0, 0.2]  # world linear velocity, local angular velocity
    lines: list[str] = []
    truth = GroundTruth(model, data, base=0, every=5.0)
    dt = 0.02
    for k in range(301):  # 6 s
        truth.step(k * dt, [0.5, 0.0, 0.2], lines.append)
        data.qpos[1] += 0.5 * dt
    assert lines == [
        "sim robot (ground truth): forward 0.50 m/s (cmd 0.50), lateral 0.00 m/s (cmd 0.00), yaw rate 0.20 rad/s "
        "(cmd 0.20), height 0.50 m, travelled 2.5 m"
    ]
    summary = truth.summary(6.0)
    assert summary.startswith("sim robot (ground truth): travelled 3.0 m in 6.0 s; means forward 0.50 m/s (cmd 0.50)")
    assert summary.endswith("lowest height 0.50 m")
    assert np.isclose(truth.travelled, 3.0)


def test_no_command_and_no_steps_say_so() -> None:
    model = mujoco.MjModel.from_xml_string(BASE)
    truth = GroundTruth(model, mujoco.MjData(model), base=0)
    assert truth.summary(1.0) == ""
    truth.step(0.0, None, print)
    assert "(cmd" not in truth.summary(0.0)
