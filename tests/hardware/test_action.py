"""One action mapping: the task, the shield and the gate's inverse all use `q2real.hardware.action`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from q2real.hardware import robot_spec
from q2real.hardware.action import action_from_command, action_mapping, command_from_action
from q2real.safety.compiled import Shield
from q2real.safety.shield import ShieldConfig
from q2real.sim import make

TASKS = {"pendulum": "pendulum_swingup", "panda": "panda_reach", "spot": "spot_joystick"}
DEFAULT_SCALES = {"pendulum": None, "panda": 1.0, "spot": 0.5}
"""Each task's documented default: torque tasks the whole effort range, position tasks rad."""


@pytest.mark.parametrize("robot", sorted(TASKS))
def test_task_and_shield_map_actions_as_the_spec_says(robot: str) -> None:
    spec = robot_spec(robot)
    env = make(task=TASKS[robot], num_envs=1, backend="mujoco", device="cpu")
    try:
        assert env.task.config.action_scale == DEFAULT_SCALES[robot]
        scale, offset = action_mapping(spec, DEFAULT_SCALES[robot])
        np.testing.assert_allclose(env.task.command_scale.numpy(), scale, rtol=1e-6)
        np.testing.assert_allclose(env.task.command_offset.numpy(), offset, rtol=1e-6)
    finally:
        env.close()
    # A shield configured without a bundle maps over the whole range.
    scale, offset = action_mapping(spec)
    shield = Shield(spec, ShieldConfig())
    np.testing.assert_array_equal(shield.scale, scale)
    np.testing.assert_array_equal(shield.offset, offset)
    if spec.control_mode == "torque":
        np.testing.assert_array_equal(scale, spec.array("effort_limit"))
    else:
        low, high = spec.array("position_limits").T
        assert (offset + scale <= high).all() and (offset - scale >= low).all()


def test_the_inverse_undoes_the_mapping_on_numpy_and_torch() -> None:
    scale, offset = np.array([2.0, 0.0, 0.5]), np.array([0.1, 0.3, -1.0])
    action = np.array([[0.5, 0.7, -1.0]])
    command = command_from_action(action, scale, offset)
    np.testing.assert_allclose(command, [[1.1, 0.3, -1.5]])
    np.testing.assert_allclose(action_from_command(command, scale, offset), [[0.5, 0.0, -1.0]])  # scale 0 reads 0
    as_torch = action_from_command(torch.tensor(command), torch.tensor(scale), torch.tensor(offset))
    np.testing.assert_allclose(as_torch.numpy(), [[0.5, 0.0, -1.0]])


@pytest.mark.parametrize(
    ("task", "action_scale"), [("panda_reach", 0.5), ("spot_joystick", 0.25), ("pendulum_swingup", 0.5)]
)
def test_a_tasks_action_scale_reaches_the_bundle_the_node_and_the_gate(
    task: str, action_scale: float, tmp_path
) -> None:
    """One mapping: the task's `action_scale` sets the env's scale, the bundle carries it, and the node's
    shield and the gate's shield map actions with it; commands stay inside the limits."""
    from q2real.deploy_ros.node import PolicyNode
    from tests.deploy_ros.conftest import export_fresh_agent

    env = make(task=task, num_envs=1, backend="mujoco", device="cpu", task_params={"action_scale": action_scale})
    spec = env.task.spec
    full, offset = action_mapping(spec)
    scale = env.task.command_scale.double().numpy()
    env.close()
    expected = full * action_scale if spec.control_mode == "torque" else np.minimum(full, action_scale)
    np.testing.assert_allclose(scale, expected, rtol=1e-6)
    assert (scale < full).any(), "the scale must change the mapping for this test to mean anything"
    bundle = export_fresh_agent(task, tmp_path / "b.onnx", task_params={"action_scale": action_scale})
    node = PolicyNode(bundle)
    np.testing.assert_allclose(node.shield.scale, scale, rtol=1e-6)
    np.testing.assert_allclose(node.shield.offset, offset, rtol=1e-6)


@pytest.mark.parametrize(("robot", "value"), [("pendulum", 1.5), ("pendulum", 0.0), ("panda", 4.0), ("panda", -0.1)])
def test_an_action_scale_outside_its_range_is_refused(robot: str, value: float) -> None:
    with pytest.raises(ValueError, match="action_scale: expected"):
        action_mapping(robot_spec(robot), value)


def test_a_bad_action_scale_in_a_task_config_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"env.task_params.action_scale: .*robot.yaml: action_scale: expected rad"):
        make(task="panda_reach", num_envs=1, backend="mujoco", device="cpu", task_params={"action_scale": 5.0})
