"""The transfer gate's ROS 2 row: the bundle through the deploy node against the sim-in-the-loop robot.

`q2real deploy --sim` runs as it would for a user (node in this process, robot in its own, loopback
DDS). A third participant records the joint states and commands on the wire and, for tasks with a
command, publishes one on the node's command input. The return is the task's own reward evaluated
on the recorded joint states (sensors recomputed from them by forward kinematics) over one episode
from the moment the node reports RUN. The robot starts at its default pose, not from the task's
reset distribution, and runs in real time, so this row takes one episode of wall-clock time.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from pathlib import Path

import mujoco
import numpy as np
import torch

from q2real.agents.config import TrainConfig
from q2real.deploy_ros import messages as msg
from q2real.deploy_ros.dds import SENSOR_QOS, Endpoints, use_loopback
from q2real.deploy_ros.session import deploy
from q2real.deploy_ros.settings import NODE_NAME, NodeConfig
from q2real.gate.transfer import GateError
from q2real.hardware.action import action_from_command
from q2real.sim.physics import PhysicsState
from q2real.sim.registry import make_task


class _Wire:
    """Joint states, commands and mode changes as they pass, with their arrival times."""

    def __init__(self, endpoints: Endpoints, command_topic: str):
        self.states: list[tuple[float, list[str], list[float], list[float]]] = []
        self.commands: list[tuple[float, np.ndarray]] = []
        self.run_since: float | None = None
        self.readers = [
            endpoints.reader("/joint_states", msg.JointState, self._state, SENSOR_QOS),
            endpoints.reader(command_topic, msg.Float64MultiArray, self._command),
            endpoints.reader("/diagnostics", msg.DiagnosticArray, self._diagnostics),
        ]

    def _state(self, m) -> None:
        self.states.append((time.monotonic(), list(m.name), list(m.position), list(m.velocity)))

    def _command(self, m) -> None:
        self.commands.append((time.monotonic(), np.asarray(m.data, dtype=float)))

    def _diagnostics(self, m) -> None:
        if self.run_since is None and m.status and m.status[0].message.startswith("RUN"):
            self.run_since = time.monotonic()


def ros_return(bundle: str | Path, config: TrainConfig, progress=print) -> float:
    """Return of one episode of the bundle run through the ROS 2 node on the sim robot."""
    env = make_task(dataclasses.replace(config.env, num_envs=1, backend="mujoco", device="cpu"))
    task, model = env.task, env.task.model
    env.close()
    node_config = NodeConfig(autostart=True)
    period = task.spec.control_period
    episode = task.config.episode_length
    use_loopback()
    endpoints = Endpoints(node="q2real_transfer")
    wire = _Wire(endpoints, node_config.command_topic())
    task.command = task.sample_command(1, torch.Generator().manual_seed(0))
    stop = threading.Event()
    publisher = None
    if task.command_dim:
        writer = endpoints.writer(f"/{NODE_NAME}/command", msg.Float64MultiArray)
        value = msg.Float64MultiArray(layout=msg.MultiArrayLayout(dim=[], data_offset=0), data=task.command[0].tolist())

        def publish() -> None:
            while not stop.wait(0.1):
                writer.write(value)

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
    progress(f"  ROS 2 row: node + sim robot in real time, {node_config.shield.ramp_time + episode * period:.0f} s")
    try:
        deploy(
            bundle,
            node_config,
            sim=True,
            duration=node_config.shield.ramp_time + episode * period + 1.0,
            status_every=None,
        )
    finally:
        stop.set()
        if publisher is not None:
            publisher.join()
        endpoints.close()
    if wire.run_since is None:
        raise GateError("ROS 2 row: the node never reported RUN on /diagnostics; no return to measure")
    return _episode_return(task, model, wire, episode)


def _episode_return(task, model: mujoco.MjModel, wire: _Wire, episode: int) -> float:
    data = mujoco.MjData(model)
    run_since = wire.run_since if wire.run_since is not None else math.inf
    states = [s for s in wire.states if s[0] >= run_since][:episode]
    if len(states) < episode:
        raise GateError(f"ROS 2 row: recorded {len(states)} joint states after RUN, fewer than one episode ({episode})")
    scale, offset = task.command_scale.numpy(), task.command_offset.numpy()
    commands = wire.commands
    total, c = 0.0, 0
    for stamp, names, position, velocity in states:
        for name, q, qd in zip(names, position, velocity, strict=True):
            joint = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
            data.qpos[model.jnt_qposadr[joint]], data.qvel[model.jnt_dofadr[joint]] = q, qd
        mujoco.mj_forward(model, data)
        while c + 1 < len(commands) and commands[c + 1][0] <= stamp:
            c += 1
        command = commands[c][1] if commands and commands[c][0] <= stamp else offset
        action = torch.from_numpy(action_from_command(command, scale, offset)).float()[None]
        physics = PhysicsState(
            torch.from_numpy(data.qpos.copy()).float()[None],
            torch.from_numpy(data.qvel.copy()).float()[None],
            torch.from_numpy(data.sensordata.copy()).float()[None],
        )
        total += float(task.reward(physics, action)[0])
    return total
