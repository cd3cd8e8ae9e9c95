"""Batched forward kinematics against MuJoCo's own on random joint positions."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

from q2real.configs.loader import ConfigError
from q2real.hardware import robot_spec
from q2real.hardware.model import load_model
from q2real.sim.kinematics import BodyPoint

SLIDER = """
<mujoco>
  <worldbody>
    <body name="carriage" pos="0.1 0.2 0.3" quat="0.9 0.1 0.3 0.2">
      <joint name="rail" type="slide" axis="0.6 0 0.8" ref="0.05"/>
      <geom size="0.05"/>
      <body name="arm" pos="0 0.4 0" euler="10 20 30">
        <joint name="elbow" type="hinge" axis="0 0.6 0.8" pos="0.1 0 0.05" ref="0.3"/>
        <geom size="0.05"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


def _mujoco_point(model: mujoco.MjModel, qpos: np.ndarray, body: int, offset: np.ndarray) -> np.ndarray:
    data = mujoco.MjData(model)
    data.qpos[:] = qpos
    mujoco.mj_kinematics(model, data)
    return data.xpos[body] + data.xmat[body].reshape(3, 3) @ offset


@pytest.mark.parametrize("robot", ["panda", "slider"])
def test_a_body_point_is_where_mujoco_puts_it(robot: str) -> None:
    """Hinges about an offset anchor, slides, reference positions and rotated bodies, over +-2 pi."""
    if robot == "panda":
        model, body = load_model(robot_spec("panda")), "link7"
    else:
        model, body = mujoco.MjModel.from_xml_string(SLIDER), "arm"
    offset = np.array([0.03, -0.02, 0.11])
    point = BodyPoint(model, body, offset, torch.device("cpu"))
    gen = np.random.default_rng(0)
    qpos = model.qpos0 + gen.uniform(-2 * np.pi, 2 * np.pi, (64, model.nq))
    got = point(torch.from_numpy(qpos)).double().numpy()
    index = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body)
    expected = np.stack([_mujoco_point(model, q, index, offset) for q in qpos])
    np.testing.assert_allclose(got, expected, atol=2e-6)


def test_a_floating_chain_or_an_unknown_body_is_refused() -> None:
    model = load_model(robot_spec("spot"))
    with pytest.raises(ConfigError, match="not a hinge or slide"):
        BodyPoint(model, model.body(model.nbody - 1).name, [0, 0, 0], torch.device("cpu"))
    with pytest.raises(ConfigError, match="no body 'hand2'"):
        BodyPoint(model, "hand2", [0, 0, 0], torch.device("cpu"))


def test_a_point_on_a_floating_robot_is_where_mujoco_puts_it() -> None:
    """GR1's foot under a random base pose (an unnormalized quaternion too) and random leg joints."""
    model = load_model(robot_spec("gr1_legs"))
    offset = np.array([0.02, 0.01, -0.03])
    point = BodyPoint(model, "left_foot", offset, torch.device("cpu"), floating=True)
    gen = np.random.default_rng(1)
    qpos = model.qpos0 + gen.uniform(-1.0, 1.0, (32, model.nq))
    qpos[:, 3:7] = gen.normal(size=(32, 4)) * 1.3
    got = point(torch.from_numpy(qpos)).double().numpy()
    index = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "left_foot")
    expected = np.stack([_mujoco_point(model, q, index, offset) for q in qpos])
    np.testing.assert_allclose(got, expected, atol=1e-5)
