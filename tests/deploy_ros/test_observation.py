"""The robot-side observation builder must reproduce each task's own observation from joint states."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest
import torch

from q2real.deploy_ros.observation import ObservationBuilder
from q2real.deploy_ros.schema import BundleError
from q2real.sim import make
from q2real.sim.physics import PhysicsState
from q2real.sim.registry import TASKS, task_names
from q2real.sim.task import Task


def _metadata(env) -> dict:
    terms = [
        {"name": n, "dim": d, "source": s} for n, d, s in zip(env.obs_names, env.obs_dims, env.obs_sources, strict=True)
    ]
    return {"observation": {"dim": env.obs_dim, "terms": terms}, "action": {"dim": env.action_dim}}


# Their observations need a base IMU or an object tracker, which the joint-state node does not read.
NOT_DEPLOYABLE = {"panda_push", "spot_joystick", "gr1_stand"}


def test_only_the_listed_tasks_lack_robot_side_sources() -> None:
    lacking = {t for t in task_names() if TASKS[t].observation_sources is Task.observation_sources}
    assert lacking == NOT_DEPLOYABLE


@pytest.mark.parametrize("task", sorted(set(task_names()) - NOT_DEPLOYABLE))
def test_builder_reproduces_the_task_observation(task: str) -> None:
    env = make(task=task, num_envs=1, device="cpu")
    assert env.obs_sources is not None, f"{task} does not say where its observation terms come from"
    builder = ObservationBuilder(_metadata(env), task)
    model = env.task.model
    gen = torch.Generator().manual_seed(0)
    qpos = (torch.rand(64, model.nq, generator=gen) * 2 - 1) * 2 * math.pi
    qvel = torch.randn(64, model.nv, generator=gen) * 5
    env.task.command = torch.randn(64, env.task.command_dim, generator=gen)
    expected = env.task.observe(PhysicsState(qpos, qvel, torch.zeros(64, model.nsensordata)))
    joints = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in builder.joints]
    for row in range(64):
        position = qpos[row, [model.jnt_qposadr[j] for j in joints]].double().numpy()
        velocity = qvel[row, [model.jnt_dofadr[j] for j in joints]].double().numpy()
        got = builder(position, velocity, np.zeros(env.action_dim), env.task.command[row].double().numpy())
        np.testing.assert_allclose(got[0], expected[row].numpy(), rtol=1e-5, atol=1e-5)
    env.close()


def test_last_action_and_command_terms_fill_from_their_inputs() -> None:
    meta = {
        "observation": {
            "dim": 6,
            "terms": [
                {"name": "q", "dim": 1, "source": {"kind": "joint_position", "joints": ["a"]}},
                {"name": "target", "dim": 2, "source": {"kind": "command"}},
                {"name": "previous", "dim": 2, "source": {"kind": "last_action"}},
                {"name": "speed", "dim": 1, "source": {"kind": "command"}},
            ],
        },
        "action": {"dim": 2},
    }
    builder = ObservationBuilder(meta, "bundle.onnx")
    assert builder.command_dim == 3
    got = builder(np.array([0.5]), np.array([0.0]), np.array([0.1, -0.2]), np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(got[0], [0.5, 1.0, 2.0, 0.1, -0.2, 3.0], rtol=1e-6)
    with pytest.raises(ValueError, match="needs a task command"):
        builder(np.array([0.5]), np.array([0.0]), np.zeros(2))


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (None, "does not say how to build"),
        ({"kind": "imu"}, "one of"),
        ({"kind": "joint_velocity", "joints": []}, "joint names"),
        ({"kind": "joint_position_cos_sin", "joints": ["a"]}, "disagrees with its source"),
    ],
)
def test_a_term_without_a_usable_source_is_refused(source, match) -> None:
    term = {"name": "t", "dim": 1} | ({"source": source} if source is not None else {})
    meta = {"observation": {"dim": 1, "terms": [term]}, "action": {"dim": 1}}
    with pytest.raises(BundleError, match=match):
        ObservationBuilder(meta, "bundle.onnx")
