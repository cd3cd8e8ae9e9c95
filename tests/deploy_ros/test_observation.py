"""The robot-side observation builder must reproduce each task's own observation from joint states."""

from __future__ import annotations

import math
from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch
import yaml

from q2real.contracts.schema import BundleError
from q2real.deploy_ros.inputs import Inputs, imu_in_base, rotation_matrix
from q2real.deploy_ros.observation import UNRANGED_COMMAND_LIMIT, ObservationBuilder
from q2real.deploy_ros.settings import InputsConfig, TopicConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.gate.sim_robot import SimWorld
from q2real.gate.sim_settings import SimRobotConfig
from q2real.hardware import RobotSpec, load_spec, robot_spec
from q2real.hardware.model import load_model
from q2real.hardware.spec import HARDWARE_DIR
from q2real.sim import make
from q2real.sim.physics import PhysicsState
from q2real.sim.registry import TASKS, task_names
from q2real.sim.task import Task


def _metadata(env) -> dict:
    terms = [
        {"name": n, "dim": d, "source": s} for n, d, s in zip(env.obs_names, env.obs_dims, env.obs_sources, strict=True)
    ]
    return {"observation": {"dim": env.obs_dim, "terms": terms}, "action": {"dim": env.action_dim}}


# Benchmark tasks on gymnasium's planar runners: their root joints are no robot's measurement.
NOT_DEPLOYABLE = {"hopper_velocity", "walker2d_velocity", "half_cheetah_velocity"}
DEPLOYABLE = sorted(set(task_names()) - NOT_DEPLOYABLE)


def test_every_registered_task_says_where_its_observation_comes_from_on_a_robot() -> None:
    lacking = {t for t in task_names() if TASKS[t].observation_sources is Task.observation_sources}
    assert lacking == NOT_DEPLOYABLE


def _random_states(model: mujoco.MjModel, rows: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Joint angles over +-2 pi, velocities of a few rad/s, and free joints at random poses (unit quaternions)."""
    qpos = (torch.rand(rows, model.nq, generator=gen, dtype=torch.float64) * 2 - 1) * 2 * math.pi
    qvel = torch.randn(rows, model.nv, generator=gen, dtype=torch.float64) * 3
    for j in range(model.njnt):
        if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
            q = int(model.jnt_qposadr[j])
            qpos[:, q : q + 3] = torch.randn(rows, 3, generator=gen, dtype=torch.float64)
            quat = torch.randn(rows, 4, generator=gen, dtype=torch.float64)
            qpos[:, q + 3 : q + 7] = quat / quat.norm(dim=-1, keepdim=True)
    return qpos, qvel


def _node_observation(
    world: SimWorld, builder: ObservationBuilder, inputs: Inputs, qpos, qvel, command, previous, history=None
):
    """The node's observation of one simulator state: the sim robot's messages for it (joint states, IMU,
    the object's pose, a Twist for a velocity command) and the policy's previous outputs through the
    node's inputs and builder."""
    world.data.qpos[:], world.data.qvel[:] = qpos.double().numpy(), qvel.double().numpy()
    mujoco.mj_forward(world.model, world.data)
    state = world.joint_state(msg.Time())
    by_name = {n: (p, v) for n, p, v in zip(state.name, state.position, state.velocity, strict=True)}
    position = np.array([by_name[n][0] for n in builder.joints])
    velocity = np.array([by_name[n][1] for n in builder.joints])
    command = command.double().numpy()
    if "imu" in builder.streams:
        assert inputs.on_imu(world.imu_message(msg.Time()), 0.0) is None
    if "object_pose" in builder.streams:
        assert inputs.on_object_pose(world.object_message(msg.Time()), 0.0) is None
    if "velocity_command" in builder.streams:
        twist = msg.Twist(msg.Vector3(command[0], command[1], 0.0), msg.Vector3(0.0, 0.0, command[2]))
        assert inputs.on_velocity_command(twist, 0.0) is None
    values = {"last_action": previous.double().numpy(), "command": command} | inputs.values(0.0)
    if history is not None:
        values["action_history"] = history.double().numpy()
    return builder(position, velocity, values)


def _rotated_imu(tmp_path: Path, robot: str) -> RobotSpec:
    data = yaml.safe_load((HARDWARE_DIR / robot / "robot.yaml").read_text())
    data["model"] = str(HARDWARE_DIR / robot / "model.xml")
    data["imu"]["rotation"] = [0.5, 0.5, -0.5, 0.5]  # a 120-degree turn about (1, -1, 1)
    (tmp_path / "robot.yaml").write_text(yaml.safe_dump(data))
    return load_spec(tmp_path / "robot.yaml")


@pytest.mark.parametrize(
    ("task", "mounting", "last_action"),
    [(t, "shipped", False) for t in DEPLOYABLE]
    + [("spot_joystick", "rotated", False), ("gr1_stand", "rotated", False)]
    + [("panda_reach", "shipped", True), ("spot_joystick", "shipped", True)],
)
def test_builder_reproduces_the_task_observation_from_the_robots_messages(
    task: str, mounting: str, last_action: bool, tmp_path
) -> None:
    """Sim states -> the messages the sim robot publishes (joint states; IMU from MuJoCo's sensors at
    the spec's site, mounted as the spec says; the object tracker's pose; a Twist) and the policy's
    previous action -> the node's inputs and builder -> the task's own observation."""
    env = make(task=task, num_envs=1, device="cpu", task_params={"observe_last_action": last_action})
    assert ("last_action" in env.obs_names) == last_action
    assert env.obs_sources is not None, f"{task} does not say where its observation terms come from"
    spec = _rotated_imu(tmp_path, env.task.robot) if mounting == "rotated" else env.task.spec
    world = SimWorld(spec, SimRobotConfig(task=task))
    builder = ObservationBuilder(_metadata(env), task, lambda: load_model(spec))
    inputs = Inputs(builder, InputsConfig(), spec.imu, TopicConfig(), task)
    model, data = env.task.model, mujoco.MjData(env.task.model)
    gen = torch.Generator().manual_seed(0)
    rows = 32
    qpos, qvel = _random_states(model, rows, gen)
    env.task.command = env.task.sample_command(rows, gen)
    env.task.last_action = torch.rand(rows, env.action_dim, generator=gen) * 2 - 1
    sensors = torch.zeros(rows, model.nsensordata, dtype=torch.float64)
    for row in range(rows):
        data.qpos[:], data.qvel[:] = qpos[row].numpy(), qvel[row].numpy()
        mujoco.mj_forward(model, data)
        sensors[row] = torch.from_numpy(data.sensordata.copy())
    expected = env.task.observe(PhysicsState(qpos.float(), qvel.float(), sensors.float()))
    for row in range(rows):
        got = _node_observation(
            world, builder, inputs, qpos[row], qvel[row], env.task.command[row], env.task.last_action[row]
        )
        np.testing.assert_allclose(got[0], expected[row].numpy(), rtol=1e-5, atol=1e-5)
    env.close()


def test_imu_mounting_round_trips_through_the_base_frame() -> None:
    """A base orientation and spin, seen by an IMU mounted at random rotations, come back in the base frame."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        base, mount = (q / np.linalg.norm(q) for q in rng.normal(size=(2, 4)))
        omega_base = rng.normal(size=3) * 3
        imu = np.zeros(4)
        mujoco.mju_mulQuat(imu, base, mount)  # world <- base <- IMU
        r_bi = rotation_matrix(*mount)
        gravity, omega = imu_in_base((*imu[1:], imu[0]), r_bi.T @ omega_base, r_bi)
        np.testing.assert_allclose(gravity, rotation_matrix(*base).T @ [0, 0, -1], atol=1e-12)
        np.testing.assert_allclose(omega, omega_base, atol=1e-12)


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
    inputs = {"last_action": np.array([0.1, -0.2]), "command": np.array([1.0, 2.0, 3.0])}
    got = builder(np.array([0.5]), np.array([0.0]), inputs)
    np.testing.assert_allclose(got[0], [0.5, 1.0, 2.0, 0.1, -0.2, 3.0], rtol=1e-6)
    with pytest.raises(ValueError, match="needs a 'command' input"):
        builder(np.array([0.5]), np.array([0.0]), {"last_action": np.zeros(2)})


def test_command_values_are_named_and_bounded_by_their_terms_ranges_or_the_fallback() -> None:
    """A term with `ranges` bounds its values by them; one without (a bundle from before them) by
    +-UNRANGED_COMMAND_LIMIT, which keeps a value that would overflow float32 out of the observation."""
    meta = {
        "observation": {
            "dim": 3,
            "terms": [
                {"name": "target", "dim": 2, "source": {"kind": "command", "ranges": [[0.3, 0.6], [-0.2, 0.2]]}},
                {"name": "speed", "dim": 1, "source": {"kind": "command"}},
            ],
        },
        "action": {"dim": 1},
    }
    builder = ObservationBuilder(meta, "bundle.onnx")
    assert builder.command_names == ["target[0]", "target[1]", "speed"]
    assert builder.command_refusal(np.array([0.3, 0.2, -UNRANGED_COMMAND_LIMIT])) is None
    refusal = builder.command_refusal(np.array([0.5, 0.25, 0.0]))
    assert refusal == "target[1] (value 1) = 0.25: expected within [-0.2, 0.2], the range the policy was trained on"
    refusal = builder.command_refusal(np.array([0.5, 0.0, 1e308]))
    assert refusal is not None and refusal.startswith("speed (value 2) = 1e+308: expected within +-100 (the bundle")


def test_joint_terms_in_any_order_and_overlap_are_exactly_numpys() -> None:
    """The compiled joint terms against the same terms written in numpy: the joints picked out of
    order, one joint in three terms, an offset, and angles far past +-pi."""
    meta = {
        "observation": {
            "dim": 10,
            "terms": [
                {"name": "angles", "dim": 4, "source": {"kind": "joint_position_cos_sin", "joints": ["c", "a"]}},
                {"name": "speed", "dim": 2, "source": {"kind": "joint_velocity", "joints": ["b", "c"]}},
                {
                    "name": "pose",
                    "dim": 3,
                    "source": {"kind": "joint_position", "joints": ["a", "b", "c"], "offset": [0.5, -1.0, 0.0]},
                },
                {"name": "c_again", "dim": 1, "source": {"kind": "joint_position", "joints": ["c"]}},
            ],
        },
        "action": {"dim": 1},
    }
    builder = ObservationBuilder(meta, "bundle.onnx")
    rng = np.random.default_rng(3)
    a, b, c = (builder.joints.index(n) for n in "abc")
    for scale in (1e-3, 1.0, 40.0, 1e4):
        q, qd = rng.normal(size=3) * scale, rng.normal(size=3) * scale
        expected = np.concatenate(
            [np.cos(q[[c, a]]), np.sin(q[[c, a]]), qd[[b, c]], q[[a, b, c]] - [0.5, -1.0, 0.0], q[[c]]]
        ).astype(np.float32)
        np.testing.assert_allclose(builder(q, qd, {})[0], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (None, "does not say how to build"),
        ({"kind": "imu"}, "one of"),
        ({"kind": "joint_velocity", "joints": []}, "joint names"),
        ({"kind": "joint_position_cos_sin", "joints": ["a"]}, "disagrees with its source"),
        ({"kind": "command", "ranges": [[1.0, 0.0]]}, r"source.ranges: expected 1 \[lower, upper\] pairs"),
        ({"kind": "command", "ranges": [[0.0, 1.0], [0.0, 1.0]]}, "source.ranges: expected 1"),
        ({"kind": "command", "ranges": [[0.0, None]]}, r"source.ranges\[0\]: expected 2 finite numbers"),
    ],
)
def test_a_term_without_a_usable_source_is_refused(source, match) -> None:
    term = {"name": "t", "dim": 1} | ({"source": source} if source is not None else {})
    meta = {"observation": {"dim": 1, "terms": [term]}, "action": {"dim": 1}}
    with pytest.raises(BundleError, match=match):
        ObservationBuilder(meta, "bundle.onnx")


def test_the_sim_robots_imu_noise_and_bias_stay_readings_the_node_accepts() -> None:
    """Noise tilts the orientation by a random rotation (still a unit quaternion) and adds white noise
    and a fixed bias to the gyro, as the training randomization perturbs observations."""
    spec = robot_spec("spot")
    clean = SimWorld(spec, SimRobotConfig())
    noisy = SimWorld(spec, SimRobotConfig(imu_noise=0.05, imu_bias=0.02, seed=3))
    builder = ObservationBuilder({"observation": {"dim": 3, "terms": [_gravity]}, "action": {"dim": 12}}, "t")
    inputs = Inputs(builder, InputsConfig(), spec.imu, TopicConfig(), "t")
    tilts, gyros = [], []
    for _ in range(300):
        assert inputs.on_imu(noisy.imu_message(msg.Time()), 0.0) is None
        gravity = inputs.values(0.0)["projected_gravity"]
        assert inputs.on_imu(clean.imu_message(msg.Time()), 0.0) is None
        tilts.append(math.acos(np.clip(gravity @ inputs.values(0.0)["projected_gravity"], -1, 1)))
        gyros.append([noisy.imu_message(msg.Time()).angular_velocity.x])
    assert 0.01 < np.mean(tilts) < 0.1, np.mean(tilts)  # |N(0, 0.05)| has mean 0.04
    assert abs(np.mean(gyros) - noisy.gyro_bias[0]) < 0.01 and 0.03 < np.std(gyros) < 0.07
    assert abs(noisy.gyro_bias[0]) <= 0.02 and noisy.gyro_bias.any()


_gravity = {"name": "g", "dim": 3, "source": {"kind": "projected_gravity"}}


@pytest.mark.parametrize("task", DEPLOYABLE)
def test_the_observation_training_steps_to_is_the_nodes_of_the_same_state(task: str) -> None:
    """After real env steps (physics substeps, auto-resets, commands redrawn), the observation a policy
    trains on equals what the node builds from the simulator state the step ended in: no term read
    from an older state (MuJoCo's sensors are one substep behind the joints after a step)."""
    env = make(task=task, num_envs=4, device="cpu", task_params={"observe_last_action": True, "action_history": 2})
    spec = env.task.spec
    world = SimWorld(spec, SimRobotConfig(task=task))
    builder = ObservationBuilder(_metadata(env), task, lambda: load_model(spec))
    inputs = Inputs(builder, InputsConfig(), spec.imu, TopicConfig(), task)
    gen = torch.Generator().manual_seed(1)
    env.reset(seed=1)
    for _ in range(6):
        result = env.step(torch.rand(env.num_envs, env.action_dim, generator=gen) * 2 - 1)
        physics, task_state = env.physics, env.task
        for row in range(env.num_envs):
            got = _node_observation(
                world, builder, inputs, physics.qpos[row], physics.qvel[row], task_state.command[row],
                task_state.last_action[row], task_state.action_history[row],
            )  # fmt: skip
            np.testing.assert_allclose(got[0], result.obs[row].numpy(), rtol=1e-5, atol=2e-5)
    env.close()
