"""A robot played by MuJoCo in real time, over the same ROS 2 wire a physical robot would use.

It behaves like a ros2_control robot with a joint_state_broadcaster and a forward-command (or
trajectory) controller: it publishes `sensor_msgs/JointState` for every hinge and slide joint of its
model at its rate (efforts NaN where no actuator drives the joint, as the broadcaster does), and
applies the newest command each period: efforts for torque-controlled robots, PD position targets
(the spec's kp/kd, run by MuJoCo at the physics rate) otherwise. A drive without fresh commands for
`command_timeout` seconds stops: zero effort, or a hold at the last target.

Run it as its own process (`python -m q2real.deploy_ros.sim_robot ROBOT`), so that a crash of either
side is a crash of a separate program, as on a real robot.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

import mujoco
import numpy as np

from q2real.deploy_ros import messages as msg
from q2real.deploy_ros.commands import command_values, stamp_now
from q2real.deploy_ros.dds import Endpoints, use_loopback
from q2real.deploy_ros.settings import NodeConfig
from q2real.hardware.spec import RobotSpec, actuator_for_joint, robot_spec


@dataclass
class SimRobotConfig:
    rate: float | None = None
    """Joint-state and control rate in Hz; None: the spec's control rate."""
    command_style: Literal["forward", "trajectory"] = "forward"
    joint_states_topic: str = "/joint_states"
    command_topic: str | None = None
    """None: the default topic of the command style's ros2_control controller."""
    command_timeout: float = 0.1
    initial_qpos: dict[str, float] = field(default_factory=dict)
    """Joint name -> initial position; the others start at the spec's default pose (or 0)."""


class SimRobot:
    def __init__(self, spec: RobotSpec, config: SimRobotConfig | None = None, domain: int | None = None):
        self.spec = spec
        self.config = config = config or SimRobotConfig()
        self.model = spec.load_model()
        self.period = 1.0 / config.rate if config.rate else spec.control_period
        substeps = max(1, round(self.period / self.model.opt.timestep))
        self.model.opt.timestep = self.period / substeps
        self.substeps = substeps
        self.data = mujoco.MjData(self.model)
        one_dof = (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE)
        joints = [j for j in range(self.model.njnt) if self.model.jnt_type[j] in one_dof]
        self.names = [mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in joints]
        self.qpos_index = np.array([self.model.jnt_qposadr[j] for j in joints])
        self.dof_index = np.array([self.model.jnt_dofadr[j] for j in joints])
        self.actuated = np.array([actuator_for_joint(self.model, j) is not None for j in joints])
        spec_ids = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in spec.joint_names]
        self.actuators = np.array([actuator_for_joint(self.model, j) for j in spec_ids])
        self.gear = self.model.actuator_gear[self.actuators, 0]
        spec_qpos = [self.model.jnt_qposadr[j] for j in spec_ids]
        self.data.qpos[spec_qpos] = spec.array("default_position")
        for name, value in config.initial_qpos.items():
            jid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name)
            if jid < 0:
                raise ValueError(f"initial_qpos: '{name}' is not a joint of {spec.model_path}")
            self.data.qpos[self.model.jnt_qposadr[jid]] = value
        mujoco.mj_forward(self.model, self.data)
        self.torque = spec.control_mode == "torque"
        if not self.torque:
            self.data.ctrl[self.actuators] = self.data.qpos[spec_qpos]  # the drives hold the initial pose
        self._command: np.ndarray | None = None
        self._command_time = -np.inf
        self.refused = 0
        self.dds = Endpoints(domain, node="sim_robot")
        topic = config.command_topic or NodeConfig(command_style=config.command_style).command_topic()
        command_type = msg.JointTrajectory if config.command_style == "trajectory" else msg.Float64MultiArray
        self.writer = self.dds.writer(config.joint_states_topic, msg.JointState)
        self.reader = self.dds.reader(topic, command_type, self._on_command)
        self.received = 0

    def _on_command(self, message) -> None:
        values = command_values(message, self.config.command_style, self.spec.joint_names)
        if isinstance(values, str) or not np.isfinite(values).all():
            self.refused += 1  # a real drive rejects it too; the watchdog then stops the joint
            return
        self._command, self._command_time = values, time.monotonic()
        self.received += 1

    def _apply(self, now: float) -> None:
        fresh = self._command is not None and now - self._command_time <= self.config.command_timeout
        if self.torque:
            self.data.ctrl[self.actuators] = (self._command if fresh else 0.0) / self.gear
        elif fresh:
            self.data.ctrl[self.actuators] = self._command

    def state_message(self) -> msg.JointState:
        effort = np.where(self.actuated, self.data.qfrc_actuator[self.dof_index], np.nan)
        return msg.JointState(
            header=msg.Header(stamp=stamp_now(msg), frame_id=""),
            name=self.names,
            position=self.data.qpos[self.qpos_index].tolist(),
            velocity=self.data.qvel[self.dof_index].tolist(),
            effort=effort.tolist(),
        )

    def run(self, stop: threading.Event, duration: float | None = None, parent: int | None = None) -> None:
        """Publish, apply the newest command and step, once per period, in real time.

        With `parent` (a pid) it also stops once that process is gone: an orphan is reparented, so
        `os.getppid()` changes. Polled rather than PR_SET_PDEATHSIG, which is Linux-only and fires
        when the spawning thread exits, not the process (a node started from a worker thread).
        """
        start = next_at = time.monotonic()
        while not stop.is_set() and (duration is None or next_at - start < duration):
            if parent is not None and os.getppid() != parent:
                print(f"sim robot: parent process {parent} is gone, stopping", flush=True)
                return
            self.writer.write(self.state_message())
            now = time.monotonic()
            self._apply(now)
            mujoco.mj_step(self.model, self.data, nstep=self.substeps)
            next_at += self.period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()  # fell behind real time: do not try to catch up in a burst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m q2real.deploy_ros.sim_robot", description="A robot played by MuJoCo in real time over ROS 2 DDS"
    )
    parser.add_argument("robot", help="robot spec name in q2real/hardware (e.g. pendulum)")
    parser.add_argument("--rate", type=float, default=None, help="Hz (default: the spec's control rate)")
    parser.add_argument("--command-style", choices=("forward", "trajectory"), default="forward")
    parser.add_argument("--command-timeout", type=float, default=0.1)
    parser.add_argument("--initial", nargs="*", default=[], metavar="JOINT=VALUE", help="initial joint positions")
    parser.add_argument("--duration", type=float, default=None, help="seconds, default: until SIGINT/SIGTERM")
    parser.add_argument("--loopback", action="store_true", help="keep DDS on 127.0.0.1 (no network)")
    parser.add_argument(
        "--parent-pid", type=int, default=None, help="exit when this process dies (default: run standalone)"
    )
    args = parser.parse_args(argv)
    if args.loopback:
        use_loopback()
    initial = {}
    for item in args.initial:
        name, _, value = item.partition("=")
        initial[name] = float(value)
    config = SimRobotConfig(
        rate=args.rate, command_style=args.command_style, command_timeout=args.command_timeout, initial_qpos=initial
    )
    robot = SimRobot(robot_spec(args.robot), config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"sim robot '{args.robot}': {len(robot.names)} joints {robot.names} at {1 / robot.period:g} Hz", flush=True)
    try:
        robot.run(stop, args.duration, args.parent_pid)
    finally:
        robot.dds.close()


if __name__ == "__main__":
    main()
