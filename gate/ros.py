"""The transfer gate's ROS 2 row: the bundle through the deploy node against the sim-in-the-loop robot.

`q2real deploy --sim` runs as it would for a user (node in this process, robot in its own, loopback
DDS). A third participant records the joint states and commands on the wire, the sim robot's
ground truth of a floating base and the tracked object's pose. For a task with a command, the sim
robot publishes the episode's (`--command`): a Twist on `cmd_vel` for velocity commands, otherwise
on the node's command input.
The return is the task's own reward evaluated on the recorded states (sensors recomputed from them by
forward kinematics) over one episode from the moment the node reports RUN, ending early where the
task terminates (a fall), as the simulated rows do. Each episode is its own deployment: the sim robot
starts at the joints of one of the gate's reset states and the episode's command is sent, but the node
first ramps to the default pose, as it would on a robot (a floating base hangs on the sim robot's
gantry until the ramp is done), so the policy takes over from there. It runs in real time: each
episode takes its length in wall-clock time, plus the ramp and start-up.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np
import torch

from q2real.deploy_ros.session import deploy
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import SENSOR_QOS, Endpoints, use_loopback
from q2real.gate.sim_robot import GROUND_TRUTH_TOPIC
from q2real.gate.verdict import GateError
from q2real.hardware.action import action_from_command
from q2real.sim import EnvConfig
from q2real.sim.config import target_actions
from q2real.sim.physics import PhysicsState
from q2real.sim.registry import make_task


class _Wire:
    """Joint states, commands, base and object poses and mode changes as they pass, with arrival times."""

    def __init__(self, endpoints: Endpoints, config: NodeConfig):
        self.states: list[tuple[float, int, list[str], list[float], list[float]]] = []
        """(arrival, header stamp in ns, names, positions, velocities)."""
        self.commands: list[tuple[float, np.ndarray]] = []
        self.bases: list[tuple[int, np.ndarray, np.ndarray]] = []
        """(header stamp in ns, base qpos (7), base qvel (6) in MuJoCo's convention) from the ground
        truth; the sim robot stamps it as the joint state of the same step."""
        self.objects: list[tuple[int, np.ndarray]] = []
        """(header stamp in ns, object qpos (7)) from the tracker's pose."""
        self.run_since: float | None = None
        self.readers = [
            endpoints.reader("/joint_states", msg.JointState, self._state, SENSOR_QOS),
            endpoints.reader(config.command_topic(), msg.Float64MultiArray, self._command),
            endpoints.reader("/diagnostics", msg.DiagnosticArray, self._diagnostics),
            endpoints.reader(GROUND_TRUTH_TOPIC, msg.Odometry, self._base, SENSOR_QOS),
            endpoints.reader(config.topics.object_pose, msg.PoseStamped, self._object, SENSOR_QOS),
        ]

    def _base(self, m) -> None:
        p, o = m.pose.pose.position, m.pose.pose.orientation
        qpos = np.array([p.x, p.y, p.z, o.w, o.x, o.y, o.z])
        frame = np.zeros(9)
        mujoco.mju_quat2Mat(frame, qpos[3:])
        v, w = m.twist.twist.linear, m.twist.twist.angular
        linear = frame.reshape(3, 3) @ [v.x, v.y, v.z]  # the twist is in the base frame, MuJoCo's in the world
        self.bases.append((_ns(m.header.stamp), qpos, np.array([*linear, w.x, w.y, w.z])))

    def _object(self, m) -> None:
        p, o = m.pose.position, m.pose.orientation
        self.objects.append((_ns(m.header.stamp), np.array([p.x, p.y, p.z, o.w, o.x, o.y, o.z])))

    def _state(self, m) -> None:
        self.states.append((time.monotonic(), _ns(m.header.stamp), list(m.name), list(m.position), list(m.velocity)))

    def _command(self, m) -> None:
        self.commands.append((time.monotonic(), np.asarray(m.data, dtype=float)))

    def _diagnostics(self, m) -> None:
        if self.run_since is None and m.status and m.status[0].message.startswith("RUN"):
            self.run_since = time.monotonic()


def ros_returns(
    bundle: str | Path,
    env_config: EnvConfig,
    starts: list[tuple[dict[str, float], torch.Tensor, tuple[float, float, float] | None]],
    progress=print,
    ended: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, float, float]:
    """Returns of one episode per (initial joint positions, command, the tracked object's start or
    None) in `starts`, run through the ROS 2 node on the sim robot; the fraction of the policy's ticks
    (the node's shield in RUN, over every deployment) on which a shield clamp changed its command, and
    the mean change per tick (`q2real.safety.shield.Counters`). Each episode takes real time, so each is
    reported as it ends (`ended(1)` too)."""
    env = make_task(dataclasses.replace(target_actions(env_config), num_envs=1, backend="mujoco", device="cpu"))
    task, model = env.task, env.task.model
    env.close()
    node_config = NodeConfig(autostart=True)
    episode = task.config.episode_length
    # Slack past ramp and episode: RUN is reported a little after the ramp's end on a busy machine.
    duration = node_config.shield.ramp_time + episode * task.spec.control_period + 3.0
    progress(f"  ROS 2 row: node + sim robot in real time, {len(starts)} episodes of {duration:.0f} s and start-up")
    use_loopback()
    returns, interventions, ticks, change = [], 0, 0, 0.0
    for number, (initial, command, object_at) in enumerate(starts, 1):
        task.command = command.reshape(1, -1).cpu()
        began = time.monotonic()
        wire, summary = _deployed(bundle, node_config, task, initial, duration, object_at)
        returns.append(_episode_return(task, model, wire, episode))
        progress(f"    episode {number}/{len(starts)}: return {returns[-1]:.2f} ({time.monotonic() - began:.0f} s)")
        if ended is not None:
            ended(1)
        interventions += summary.run_interventions
        ticks += summary.run_ticks
        change += summary.run_change
    return torch.tensor(returns), interventions / max(ticks, 1), change / max(ticks, 1)


def _deployed(bundle, node_config: NodeConfig, task, initial: dict[str, float], duration: float, object_at=None):
    """One deployment from `initial` (and the tracked object at `object_at`) with the episode's command
    on the wire (the sim robot publishes it, as an operator's panel would): (what the wire saw, the
    node's summary)."""
    endpoints = Endpoints(node="q2real_transfer")
    wire = _Wire(endpoints, node_config)
    extra = ["--command", *(repr(float(v)) for v in task.command[0].tolist())] if task.command_dim else []
    if object_at is not None:
        extra += ["--object-at", *(repr(float(v)) for v in object_at)]
    try:
        summary = deploy(
            bundle, node_config, sim=True, duration=duration, status_every=None, sim_initial=initial, sim_extra=extra
        )
    finally:
        endpoints.close()
    if wire.run_since is None:
        raise GateError("ROS 2 row: the node never reported RUN on /diagnostics; no return to measure")
    return wire, summary


def _episode_return(task, model: mujoco.MjModel, wire: _Wire, episode: int) -> float:
    data = mujoco.MjData(model)
    run_since = wire.run_since if wire.run_since is not None else math.inf
    states = [s for s in wire.states if s[0] >= run_since][:episode]
    if len(states) < episode:
        raise GateError(f"ROS 2 row: recorded {len(states)} joint states after RUN, fewer than one episode ({episode})")
    scale, offset = task.command_scale.numpy(), task.command_offset.numpy()
    free = [j for j in range(model.njnt) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
    tracked = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, task.tracked_object) if task.tracked_object else -1
    base = next((j for j in free if model.jnt_bodyid[j] != tracked), None)
    obj = next((j for j in free if model.jnt_bodyid[j] == tracked), None)
    for name, stream, needed in (("ground truth", wire.bases, base), ("object pose", wire.objects, obj)):
        if needed is not None and not stream:
            raise GateError(f"ROS 2 row: the sim robot published no {name}; the reward needs it")
    total = 0.0
    first = True
    for stamp, measured, names, position, velocity in states:
        for name, q, qd in zip(names, position, velocity, strict=True):
            joint = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
            data.qpos[model.jnt_qposadr[joint]], data.qvel[model.jnt_dofadr[joint]] = q, qd
        if base is not None:
            _, qpos, qvel = _latest(wire.bases, measured)
            q, v = model.jnt_qposadr[base], model.jnt_dofadr[base]
            data.qpos[q : q + 7], data.qvel[v : v + 6] = qpos, qvel
        if obj is not None:
            data.qpos[model.jnt_qposadr[obj] : model.jnt_qposadr[obj] + 7] = _latest(wire.objects, measured)[1]
        mujoco.mj_forward(model, data)
        command = _latest(wire.commands, stamp, (stamp, offset))[1]
        action = torch.from_numpy(action_from_command(command, scale, offset)).float()[None]
        physics = PhysicsState(
            torch.from_numpy(data.qpos.copy()).float()[None],
            torch.from_numpy(data.qvel.copy()).float()[None],
            torch.from_numpy(data.sensordata.copy()).float()[None],
        )
        if first:  # what the reward remembers (a foot's time in the air) starts where the episode does
            task.reset_memory(torch.ones(1, dtype=torch.bool), physics)
            first = False
        task.advance(physics, action)
        total += float(task.reward(physics, action)[0])
        if bool(task.terminated(physics)[0]):
            break
    return total


def _ns(stamp) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def _latest(stream: list, stamp: float, before_any=None):
    """The newest entry of a time-ordered stream at or before `stamp` (the first one if none is):
    commands by arrival, the sim robot's poses by their header stamps."""
    i = bisect.bisect_right(stream, stamp, key=lambda entry: entry[0]) - 1
    if i < 0:
        return before_any if before_any is not None else stream[0]
    return stream[i]
