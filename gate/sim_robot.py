"""A robot played by MuJoCo in real time, over the same ROS 2 wire a physical robot would use.

It behaves like a ros2_control robot with a joint_state_broadcaster and a forward-command (or
trajectory) controller: it publishes `sensor_msgs/JointState` for every hinge and slide joint of its
model at its rate (efforts NaN where no actuator drives the joint, as the broadcaster does), and
applies the newest command each period: efforts for torque-controlled robots, PD position targets
(the spec's kp/kd, run by MuJoCo at the physics rate) otherwise. A drive without fresh commands for
`command_timeout` seconds stops: zero effort, or a hold at the last target.

Beside the joint states, each at its own rate:
  /imu/data            sensor_msgs/Imu from MuJoCo sensors at the spec's IMU site (robots with one),
                       with optional noise and gyro bias
  /object_pose         geometry_msgs/PoseStamped of the task's tracked object (`--task`), in `world`
  /ground_truth/odom   nav_msgs/Odometry of a floating base: the simulator's truth, for evaluating a
                       run (the transfer gate's reward); no policy reads it
A floating-base robot starts standing on its default pose; with `gantry` it hangs there (the base
held still) until that many seconds after the first command, as a humanoid is lowered from a gantry
once its controller runs.

Run it as its own process (`q2real-sim-robot ROBOT`), so that a crash of either
side is a crash of a separate program, as on a real robot. With `--task` it plays the task's world
(its objects around the robot), which needs q2real's simulator (and torch) in this process.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import mujoco
import numpy as np
from cyclonedds.idl import IdlStruct
from cyclonedds.pub import DataWriter

from q2real.configs.errors import Q2RealError
from q2real.deploy_ros.programs import SIM_ROBOT
from q2real.deploy_ros.settings import NODE_NAME, NodeConfig, resolve_topic
from q2real.deploy_ros.signals import on_signal
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.commands import command_values, stamp_now
from q2real.deploy_ros.transport.dds import LATCHED_QOS, SENSOR_QOS, Endpoints, use_loopback
from q2real.gate.ground_truth import GroundTruth, base_velocity
from q2real.gate.sim_settings import PERTURBATIONS, SimRobotConfig, add_arguments, from_arguments
from q2real.hardware.model import actuator_for_joint, load_model
from q2real.hardware.spec import RobotSpec, robot_spec
from q2real.hardware.stance import standing_height

if TYPE_CHECKING:
    from q2real.sim.task import Task

GROUND_TRUTH_TOPIC = "/ground_truth/odom"
WORLD_FRAME = "world"


class SimWorld:
    """The simulated robot and its world: physics and the messages its sensors would send, no DDS."""

    def __init__(self, spec: RobotSpec, config: SimRobotConfig):
        self.spec, self.config = spec, config
        scene, self.tracked = None, None
        if config.task is not None:
            from q2real.sim.registry import TASKS  # only the sim robot plays a task's world

            task = TASKS.get(config.task)
            if task is None or task.robot != spec.name:
                raise ValueError(f"task: '{config.task}' is not a registered task of robot '{spec.name}'")
            scene, self.tracked = task.scene, task.tracked_object
        self.task_cls = task if config.task is not None else None
        self.model = load_model(spec, lambda s: _world(s, spec, scene))
        self.data = mujoco.MjData(self.model)
        model, data = self.model, self.data
        one_dof = (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE)
        joints = [j for j in range(model.njnt) if model.jnt_type[j] in one_dof]
        self.names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in joints]
        self.qpos_index = np.array([model.jnt_qposadr[j] for j in joints])
        self.dof_index = np.array([model.jnt_dofadr[j] for j in joints])
        self.actuated = np.array([actuator_for_joint(model, j) is not None for j in joints])
        spec_ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in spec.joint_names]
        self.spec_joint_ids = spec_ids
        self.robot_root = int(model.body_rootid[int(model.jnt_bodyid[spec_ids[0]])])
        """The robot's root body (its own, not a task object's)."""
        self.actuators = np.array([actuator_for_joint(model, j) for j in spec_ids])
        self.gear = model.actuator_gear[self.actuators, 0]
        self.spec_qpos = [model.jnt_qposadr[j] for j in spec_ids]
        data.qpos[self.spec_qpos] = spec.array("default_position")
        for name, value in config.initial_qpos.items():
            jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
            if jid < 0:
                raise ValueError(f"initial_qpos: '{name}' is not a joint of {spec.model_path}")
            data.qpos[model.jnt_qposadr[jid]] = value
        self.base = self._floating_base()
        self.base_pose = None
        if self.base is not None:
            q = int(model.jnt_qposadr[self.base])
            data.qpos[q : q + 7] = (0, 0, 0, 1, 0, 0, 0)
            data.qpos[q + 2] = standing_height(model, data.qpos.copy(), q)
            self.base_pose = data.qpos[q : q + 7].copy()
        self.object_body = self.object_joint = -1
        if self.tracked is not None:
            self.object_body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, self.tracked)
            self.object_joint = int(model.body_jntadr[self.object_body])
        if config.object_position:
            position = np.asarray(config.object_position, dtype=float)
            if self.object_body < 0:
                raise ValueError("object_position: needs a task with a tracked object (--task)")
            if position.shape != (3,) or not np.isfinite(position).all():
                raise ValueError(f"object_position: expected 3 finite values x y z (m), got {position.tolist()}")
            self.place_object(position)
        self.imu = _sensor_rows(model) if spec.imu is not None else None
        rng = np.random.default_rng(config.seed)
        self.rng = rng
        self.gyro_bias = rng.uniform(-config.imu_bias, config.imu_bias, 3)
        mujoco.mj_forward(model, data)

    def _floating_base(self) -> int | None:
        """The free joint of the robot's own root body, if it has one (a task object's does not count)."""
        model = self.model
        joint = model.body_jntadr[self.robot_root]
        return int(joint) if joint >= 0 and model.jnt_type[joint] == mujoco.mjtJoint.mjJNT_FREE else None

    def place_object(self, position) -> None:
        """The tracked object at `position` (x, y, z), unrotated and at rest."""
        q, v = int(self.model.jnt_qposadr[self.object_joint]), int(self.model.jnt_dofadr[self.object_joint])
        self.data.qpos[q : q + 7] = (*position, 1.0, 0.0, 0.0, 0.0)
        self.data.qvel[v : v + 6] = 0.0

    def hold_base(self) -> None:
        """The gantry: the base back at its start pose, at rest."""
        if self.base is not None and self.base_pose is not None:
            q, v = int(self.model.jnt_qposadr[self.base]), int(self.model.jnt_dofadr[self.base])
            self.data.qpos[q : q + 7] = self.base_pose
            self.data.qvel[v : v + 6] = 0.0

    # --- messages of the current state (after mj_forward or mj_step1) -----------------------------------
    def joint_state(self, stamp) -> msg.JointState:
        data = self.data
        effort = np.where(self.actuated, data.qfrc_actuator[self.dof_index], np.nan)
        return msg.JointState(
            header=msg.Header(stamp=stamp, frame_id=""),
            name=self.names,
            position=data.qpos[self.qpos_index].tolist(),
            velocity=data.qvel[self.dof_index].tolist(),
            effort=effort.tolist(),
        )

    def imu_message(self, stamp) -> msg.Imu:
        """What the IMU at the spec's site reads: its frame's orientation in the world and its gyro."""
        assert self.imu is not None and self.spec.imu is not None, "the robot's spec names no IMU"
        orientation, gyro, accel = (self.data.sensordata[rows] for rows in self.imu)
        noise = self.config.imu_noise
        gyro = gyro + self.gyro_bias
        if noise > 0:
            gyro = gyro + self.rng.normal(0.0, noise, 3)
            tilt = np.zeros(4)
            axis = self.rng.normal(size=3)
            mujoco.mju_axisAngle2Quat(tilt, axis / np.linalg.norm(axis), abs(self.rng.normal(0.0, noise)))
            noisy = np.zeros(4)
            mujoco.mju_mulQuat(noisy, orientation, tilt)
            orientation = noisy
        w, x, y, z = orientation
        return msg.Imu(
            header=msg.Header(stamp=stamp, frame_id=self.spec.imu.site),
            orientation=msg.Quaternion(x=float(x), y=float(y), z=float(z), w=float(w)),
            angular_velocity=msg.Vector3(*map(float, gyro)),
            linear_acceleration=msg.Vector3(*map(float, accel)),
        )

    def object_message(self, stamp) -> msg.PoseStamped:
        """The tracked object's pose in the world frame, as a tracker would report it."""
        position, (w, x, y, z) = self.data.xpos[self.object_body], self.data.xquat[self.object_body]
        return msg.PoseStamped(
            header=msg.Header(stamp=stamp, frame_id=WORLD_FRAME),
            pose=msg.Pose(msg.Point(*map(float, position)), msg.Quaternion(x=x, y=y, z=z, w=w)),
        )

    def ground_truth(self, stamp) -> msg.Odometry:
        """The floating base's pose (world) and twist (base frame), straight from the simulator."""
        assert self.base is not None, "only a floating base has a ground-truth odometry"
        q, qpos = int(self.model.jnt_qposadr[self.base]), self.data.qpos
        w, x, y, z = qpos[q + 3 : q + 7]
        velocity = base_velocity(self.model, self.data, self.base)
        pose = msg.Pose(msg.Point(*map(float, qpos[q : q + 3])), msg.Quaternion(x=x, y=y, z=z, w=w))
        twist = msg.Twist(msg.Vector3(*map(float, velocity[:3])), msg.Vector3(*map(float, velocity[3:])))
        body = mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_BODY, int(self.model.jnt_bodyid[self.base]))
        return msg.Odometry(
            header=msg.Header(stamp=stamp, frame_id=WORLD_FRAME),
            child_frame_id=body or "",
            pose=msg.PoseWithCovariance(pose=pose),
            twist=msg.TwistWithCovariance(twist=twist),
        )


IMU_SENSORS = ("imu_orientation", "imu_gyro", "imu_accelerometer")


def _world(mjspec: mujoco.MjSpec, spec: RobotSpec, scene) -> None:
    """The task's objects, then the IMU's sensors at the spec's site."""
    if scene is not None:
        scene(mjspec)
    if spec.imu is not None:
        kinds = (mujoco.mjtSensor.mjSENS_FRAMEQUAT, mujoco.mjtSensor.mjSENS_GYRO, mujoco.mjtSensor.mjSENS_ACCELEROMETER)
        for name, kind in zip(IMU_SENSORS, kinds, strict=True):
            mjspec.add_sensor(name=name, type=kind, objtype=mujoco.mjtObj.mjOBJ_SITE, objname=spec.imu.site)


def _sensor_rows(model: mujoco.MjModel) -> tuple[slice, ...]:
    rows = []
    for name in IMU_SENSORS:
        sensor = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SENSOR, name)
        start = int(model.sensor_adr[sensor])
        rows.append(slice(start, start + int(model.sensor_dim[sensor])))
    return tuple(rows)


def _every(rate: float, timestep: float) -> int:
    """Physics steps between two messages of a stream at `rate` Hz (at least one)."""
    return max(1, round(1.0 / (rate * timestep)))


class Commands:
    """The task commands the sim robot publishes, as an operator's panel or a planner would: a fixed
    one, or the task's own, drawn from its command ranges once per episode of the task. A legged
    task's command is a velocity (`geometry_msgs/Twist` on /cmd_vel), any other the node's task
    command (`std_msgs/Float64MultiArray` on ~/command)."""

    def __init__(self, world: SimWorld, config: SimRobotConfig):
        self.fixed = list(config.command)
        self.task = None
        self.episodes: Episodes | None = None
        """The task's episodes, judged, for a task with a tracked object and a success test."""
        self.velocity = False
        self.episode = math.inf
        if world.task_cls is not None and (config.task_commands or self.fixed):
            import torch  # only a robot that plays a task's commands needs the simulator's task

            from q2real.sim.task import Task

            task = world.task_cls(world.spec, world.model, world.task_cls.Config(), torch.device("cpu"))
            sources = task.observation_sources() or {}
            self.velocity = any(source.get("kind") == "velocity_command" for source in sources.values())
            if config.task_commands:
                self.task, self._gen = task, torch.Generator().manual_seed(config.seed)
                # A new command as often as the task draws one in training: every episode, or every
                # `command_every` steps within one (Spot's joystick, every 5 s).
                every = task.config.command_every or task.config.episode_length
                self.episode = every * world.spec.control_period
                if world.object_body >= 0 and type(task).success is not Task.success:
                    if config.object_position:
                        raise ValueError(
                            "object_position: the task's commands place the object every episode; "
                            "give a fixed command with it"
                        )
                    self.episodes = Episodes(world, task, self._gen)
            if self.fixed and len(self.fixed) != task.command_dim:
                raise ValueError(f"command: {config.task} takes {task.command_dim} values, got {len(self.fixed)}")
        elif config.task_commands:
            raise ValueError("task_commands: needs the task whose commands to draw (--task)")
        self.current = self.fixed
        self._drawn_at = -math.inf

    @property
    def enabled(self) -> bool:
        return bool(self.fixed) or self.task is not None

    def message(self, sim_time: float) -> IdlStruct:
        """The command now: the fixed one, or the task's (a new one each time the task would draw one)."""
        if self.task is not None and sim_time - self._drawn_at >= self.episode:
            self._drawn_at = sim_time
            if self.episodes is not None:
                self.episodes.end()
            self.current = [float(v) for v in self.task.sample_command(1, self._gen)[0]]
            print(f"sim robot: task command {[round(v, 3) for v in self.current]} at {sim_time:.1f} s", flush=True)
            if self.episodes is not None:
                self.episodes.begin(self.current)
        if self.velocity:
            forward, lateral, yaw = self.current
            return msg.Twist(linear=msg.Vector3(x=forward, y=lateral, z=0.0), angular=msg.Vector3(x=0.0, y=0.0, z=yaw))
        return msg.Float64MultiArray(data=list(self.current))


class Episodes:
    """The task's episodes on the sim robot, for a task with a tracked object and a success test (a
    push): each new command places the object as training's reset does, where it touches nothing but
    the floor (as a person would put it down), and the episode that ends is judged as training's
    evaluation judges one: a success if its state ever met the task's test. An episode counts only if
    the node ran the policy (mode RUN on its `~/mode`) through all of it: start-up, the ramp, an
    operator's stop or an e-stop are never scored as a failure."""

    PLACEMENTS = 50
    """Draws of the object's start before one that touches the robot is taken anyway (and said so)."""

    def __init__(self, world: SimWorld, task: Task, gen):
        self.world, self.task, self.gen = world, task, gen
        model = world.model
        self._object_q = int(model.jnt_qposadr[world.object_joint])
        self._robot_bodies = {b for b in range(model.nbody) if int(model.body_rootid[b]) == world.robot_root}
        self.begun = self.judged = self.succeeded = 0
        self.running = False
        """Whether the node runs the policy now (its latest `~/mode` is RUN); set from the DDS thread."""
        self._live = False
        self._reached = False

    def step(self) -> None:
        """Every control step: whether the state meets the task's success test, while the policy runs."""
        if not self.running:
            self._live = False
        if self._live and not self._reached:
            import torch

            from q2real.sim.physics import PhysicsState

            data = self.world.data
            arrays = (data.qpos, data.qvel, data.sensordata)
            physics = PhysicsState(*(torch.from_numpy(a).float()[None] for a in arrays))
            success = self.task.success(physics)
            self._reached = bool(success is not None and success[0])

    def end(self) -> None:
        """Judge the episode that ends (none before the first)."""
        if self._live:
            self.judged += 1
            self.succeeded += self._reached
            outcome = "succeeded" if self._reached else "failed"
            print(f"sim robot: episode {self.begun} {outcome} ({self.succeeded} of {self.judged} so far)", flush=True)
        elif self.begun:
            print(f"sim robot: episode {self.begun} not judged: the policy did not run through all of it", flush=True)
        self._live = False

    def begin(self, command: list[float]) -> None:
        """A new episode under `command`, its object placed anew."""
        import torch

        self.begun += 1
        for _ in range(self.PLACEMENTS):
            qpos, _ = self.task.initial_state(1, self.gen)
            self.world.place_object(qpos[0, self._object_q : self._object_q + 3].numpy())
            mujoco.mj_forward(self.world.model, self.world.data)
            if not self._touches_robot():
                break
        else:
            print(f"sim robot: episode {self.begun}: no start clear of the arm in {self.PLACEMENTS} draws", flush=True)
        self.task.command = torch.tensor([command], dtype=torch.float32)
        self._reached, self._live = False, self.running

    def summary(self) -> str:
        return f"sim robot: {self.succeeded} of {self.judged} judged episodes succeeded ({self.begun} begun)"

    def _touches_robot(self) -> bool:
        model, data = self.world.model, self.world.data
        target = self.world.object_body
        for contact in data.contact[: data.ncon]:
            bodies = {int(model.geom_bodyid[contact.geom1]), int(model.geom_bodyid[contact.geom2])}
            if target in bodies and bodies & self._robot_bodies:
                return True
        return False


class SimRobot:
    def __init__(self, spec: RobotSpec, config: SimRobotConfig | None = None, domain: int | None = None):
        self.spec = spec
        self.config = config = config or SimRobotConfig()
        self.world = world = SimWorld(spec, config)
        self.model, self.data, self.names = world.model, world.data, world.names
        self.period = 1.0 / config.rate if config.rate else spec.control_period
        native = round(self.period / self.model.opt.timestep)
        self.substeps = max(1, native, math.ceil(self.period * config.drive_rate - 1e-9))
        self.model.opt.timestep = self.period / self.substeps
        self.torque = spec.control_mode == "torque"
        if not self.torque:
            self.data.ctrl[world.actuators] = self.data.qpos[world.spec_qpos]  # the drives hold the initial pose
        self._command: np.ndarray | None = None
        self._command_time = -np.inf
        self._first_command = math.inf
        self.refused = 0
        self.dds = Endpoints(domain, node="sim_robot")
        topic = config.command_topic or NodeConfig(command_style=config.command_style).command_topic()
        command_type = msg.JointTrajectory if config.command_style == "trajectory" else msg.Float64MultiArray
        topics = NodeConfig().topics
        dt = self.model.opt.timestep
        # (physics steps between messages, writer, message of the current state) per stream.
        self.streams: list[tuple[int, DataWriter, Callable[[msg.Time], IdlStruct]]] = [
            (self.substeps, self.dds.writer(config.joint_states_topic, msg.JointState), world.joint_state)
        ]
        if world.base is not None:
            writer = self.dds.writer(GROUND_TRUTH_TOPIC, msg.Odometry)
            self.streams.append((self.substeps, writer, world.ground_truth))
        if world.imu is not None:
            writer = self.dds.writer(topics.imu, msg.Imu, SENSOR_QOS)
            self.streams.append((_every(config.imu_rate, dt), writer, world.imu_message))
        if world.object_body >= 0:
            writer = self.dds.writer(topics.object_pose, msg.PoseStamped, SENSOR_QOS)
            self.streams.append((_every(config.object_rate, dt), writer, world.object_message))
        self.commands = Commands(world, config)
        self.ground_truth = GroundTruth(self.model, self.data, world.base) if world.base is not None else None
        """How the floating base really moved, printed for the operator (the node cannot measure it)."""
        if self.commands.enabled:
            # At 10 Hz: fresh for the node's velocity command timeout, and heard by a node that starts late.
            name, kind = (
                (topics.cmd_vel, msg.Twist) if self.commands.velocity else (topics.task_command, msg.Float64MultiArray)
            )
            writer = self.dds.writer(resolve_topic(name, NODE_NAME), kind)
            self.streams.append((_every(10.0, dt), writer, lambda _stamp: self.commands.message(self.data.time)))
        self.reader = self.dds.reader(topic, command_type, self._on_command)
        episodes = self.commands.episodes
        if episodes is not None:  # the node's latched mode: only episodes its policy ran through count

            def on_mode(message: msg.String) -> None:
                episodes.running = message.data == "RUN"

            self.dds.reader(resolve_topic(topics.mode, NODE_NAME), msg.String, on_mode, LATCHED_QOS)
        self.received = 0
        self.shifted = False
        self._next_reset = config.reset_every
        self._shift_fields: dict[str, np.ndarray] = {}
        if config.shift:
            self._shift_fields = self._shifted_fields(config.shift)
        self.video = None
        """The run's film (`--record-video`): the loop offers its state once a frame period."""
        if config.record_video:
            from q2real.gate.run_video import RunVideo  # rendering needs the simulator's modules (and torch)

            self.video = RunVideo(config.record_video, self.model, dt, self.data.qpos)
        self._target_radius = getattr(world.task_cls.Config(), "success_radius", 0.03) if world.task_cls else 0.03

    def _shifted_fields(self, shift: dict[str, float]) -> dict[str, np.ndarray]:
        """The model fields of the shift, computed as the training env's randomization would (its
        payload on the last joint's link)."""
        import torch  # only a robot with a shift needs the simulator's randomization

        from q2real.sim.randomization import RandomizationConfig, sample_model_fields

        ranges = {key: value if key in ("com_offset", "obs_noise_std", "obs_bias") else (value, value)
                  for key, value in shift.items()}  # fmt: skip
        try:
            config = RandomizationConfig(**ranges)  # pyright: ignore[reportArgumentType]
            config.validate("shift")
        except TypeError as err:
            raise ValueError(f"shift: {err}; expected fields of RandomizationConfig") from None
        body = int(self.model.jnt_bodyid[self.world.spec_joint_ids[-1]])
        return {
            name: values[0]
            for name, values in sample_model_fields(self.model, config, 1, torch.Generator(), body).items()
        }

    def _on_command(self, message) -> None:
        values = command_values(message, self.config.command_style, self.spec.joint_names)
        if isinstance(values, str) or not np.isfinite(values).all():
            self.refused += 1  # a real drive rejects it too; the watchdog then stops the joint
            return
        self._command, self._command_time = values, time.monotonic()
        self._first_command = min(self._first_command, self._command_time)
        self.received += 1

    def _apply(self, now: float) -> None:
        actuators = self.world.actuators
        fresh = self._command is not None and now - self._command_time <= self.config.command_timeout
        if self.torque:
            self.data.ctrl[actuators] = (self._command if fresh else 0.0) / self.world.gear
        elif fresh:
            self.data.ctrl[actuators] = self._command

    def _perturb(self, now: float) -> None:
        """The configured dynamics shift, once, and the periodic resets, on the first command's clock."""
        config, since = self.config, now - self._first_command
        if config.shift and not self.shifted and since >= config.shift_at:
            self.shifted = True
            for name, values in self._shift_fields.items():
                getattr(self.model, name)[:] = values
            print(f"sim robot: dynamics shifted ({config.shift}) {since:.1f} s after the first command", flush=True)
        if config.reset_every > 0 and since >= self._next_reset:
            self._next_reset += config.reset_every
            world, data = self.world, self.data
            spread = config.reset_spread
            data.qpos[world.spec_qpos] = self.spec.array("default_position") + world.rng.uniform(
                -spread, spread, len(world.spec_qpos)
            )
            data.qvel[:] = 0.0
            mujoco.mj_forward(self.model, data)

    def caption(self) -> tuple[str, ...]:
        """What the video writes on a frame: the time, the command published, a floating base's true velocity."""
        lines = [f"sim robot {self.spec.name}   t {self.data.time:5.1f} s"]
        current = self.commands.current
        if current and self.commands.velocity:
            lines.append(f"command  vx {current[0]:+.2f}  vy {current[1]:+.2f}  wz {current[2]:+.2f}")
        elif current:
            lines.append("command " + "  ".join(f"{value:+.3f}" for value in current))
        if self.world.base is not None:
            forward, lateral, _, _, _, yaw = base_velocity(self.model, self.data, self.world.base)
            lines.append(f"base     vx {forward:+.2f}  vy {lateral:+.2f}  wz {yaw:+.2f} (ground truth)")
        return tuple(lines)

    def target(self) -> np.ndarray | None:
        """The published command as a point to mark (a reach or push target, on the floor if 2-D)."""
        current = self.commands.current
        if self.commands.velocity or len(current) not in (2, 3):
            return None
        return np.array([*current, 0.0][:3], dtype=float)

    def run(self, stop: threading.Event, duration: float | None = None, parent: int | None = None) -> None:
        """Publish each stream when due, apply the newest command and step, one physics step per wake-up,
        in real time.

        With `parent` (a pid) it also stops once that process is gone: an orphan is reparented, so
        `os.getppid()` changes. Polled rather than PR_SET_PDEATHSIG, which is Linux-only and fires
        when the spawning thread exits, not the process (a node started from a worker thread).
        """
        model, data, world = self.model, self.data, self.world
        step, dt = 0, model.opt.timestep
        start = next_at = time.monotonic()
        while not stop.is_set() and (duration is None or next_at - start < duration):
            if parent is not None and step % self.substeps == 0 and os.getppid() != parent:
                print(f"sim robot: parent process {parent} is gone, stopping", flush=True)
                return
            now = time.monotonic()
            if self.config.gantry > 0 and now < self._first_command + self.config.gantry:
                world.hold_base()
            mujoco.mj_step1(model, data)  # sensors of the current state, before the controls act
            stamp = stamp_now(msg)
            for every, writer, message in self.streams:
                if step % every == 0:
                    writer.write(message(stamp))
            if step % self.substeps == 0:
                self._perturb(now)
                if self.commands.episodes is not None:
                    self.commands.episodes.step()
                if self.ground_truth is not None and now >= self._first_command:
                    self.ground_truth.step(data.time, self.commands.current if self.commands.velocity else None)
            self._apply(now)
            mujoco.mj_step2(model, data)
            step += 1
            if self.video is not None and step % self.video.every == 0:
                self.video.offer(step, data.qpos, self.caption(), self.target(), self._target_radius)
            next_at += dt
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()  # fell behind real time: do not try to catch up in a burst
        summary = self.ground_truth.summary(data.time) if self.ground_truth is not None else ""
        if summary:
            print(summary, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=SIM_ROBOT, description="A robot played by MuJoCo in real time over ROS 2 DDS")
    parser.add_argument("robot", help="robot spec name in q2real/hardware (e.g. pendulum)")
    add_arguments(parser)
    parser.add_argument("--duration", type=float, default=None, help="seconds, default: until SIGINT/SIGTERM")
    parser.add_argument("--loopback", action="store_true", help="keep DDS on 127.0.0.1 (no network)")
    parser.add_argument(
        "--parent-pid", type=int, default=None, help="exit when this process dies (default: run standalone)"
    )
    args = parser.parse_args(argv)
    for name in ("imu_rate", "object_rate", "drive_rate"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')}: expected a rate > 0 Hz")
    for name in ("imu_noise", "imu_bias", "gantry", *PERTURBATIONS[1:]):
        if not getattr(args, name) >= 0:
            parser.error(f"--{name.replace('_', '-')}: expected a value >= 0")
    if args.loopback:
        use_loopback()
    config = from_arguments(parser, args)
    try:
        robot = SimRobot(robot_spec(args.robot), config)
    except (ValueError, Q2RealError) as err:
        parser.error(str(err))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        on_signal(sig, stop.set)
    streams = ", ".join(
        f"{w.topic.get_name()[2:]} {1 / (every * robot.model.opt.timestep):g} Hz" for every, w, _ in robot.streams
    )
    print(f"sim robot '{args.robot}': {len(robot.names)} joints {robot.names}; publishes {streams}", flush=True)
    try:
        robot.run(stop, args.duration, args.parent_pid)
    finally:
        robot.dds.close()
        if robot.commands.episodes is not None:
            print(robot.commands.episodes.summary(), flush=True)
        if robot.video is not None:
            print(robot.video.close(), flush=True)


if __name__ == "__main__":
    main()
