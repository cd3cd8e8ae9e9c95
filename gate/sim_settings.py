"""The sim robot's settings, declared once: its config and the flags that perturb it, which its own
command line (`q2real-sim-robot`) and `q2real deploy --sim` both read. Light to import (no MuJoCo,
no DDS), so building the CLI's parser costs nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal


@dataclass
class SimRobotConfig:
    rate: float | None = None
    """Joint-state and control rate in Hz; None: the spec's control rate."""
    command_style: Literal["forward", "trajectory"] = "forward"
    joint_states_topic: str = "/joint_states"
    command_topic: str | None = None
    """None: the default topic of the command style's ros2_control controller."""
    command_timeout: float = 0.1
    drive_rate: float = 500.0
    """Hz at which the drives take the newest command (a ros2_control loop runs faster than the
    policy): physics steps are at most 1/drive_rate s, and a command acts from the first step after it
    arrives, so the node's latency, not a whole control period, separates a state from its command."""
    initial_qpos: dict[str, float] = field(default_factory=dict)
    """Joint name -> initial position; the others start at the spec's default pose (or 0)."""
    task: str | None = None
    """A registered task whose world (objects around the robot) to play; None: the robot alone."""
    imu_rate: float = 200.0
    """Hz of /imu/data (rounded to whole physics steps) for robots whose spec names an IMU."""
    imu_noise: float = 0.0
    """Std of white noise on the gyro (rad/s) and of a random tilt of the orientation (rad)."""
    imu_bias: float = 0.0
    """Bound of a constant gyro bias (rad/s) drawn once per run, uniform per axis."""
    object_rate: float = 30.0
    """Hz of /object_pose for a task with a tracked object (a camera tracker's rate)."""
    gantry: float = 0.0
    """Seconds a floating base is held still after the first command (with the node's `autostart`,
    its ramp time: released at the handover; an operator start comes later); 0: free from the start."""
    seed: int = 0
    shift: dict[str, float] = field(default_factory=dict)
    """A dynamics shift (`q2real.sim.randomization.RandomizationConfig` field -> value, e.g.
    actuator_gain_scale: 0.5, payload: 0.5) applied `shift_at` seconds after the first command."""
    shift_at: float = 0.0
    reset_every: float = 0.0
    """Seconds between two resets of the joints to the default pose plus U(-reset_spread, reset_spread)
    at rest, counted from the first command (someone knocking the robot about); 0: never."""
    reset_spread: float = 0.0
    command: tuple[float, ...] = ()
    """A fixed task command to publish (a reach target, or forward, lateral and yaw speeds for a legged
    task); empty: none, unless `task_commands`."""
    task_commands: bool = False
    """Publish the task's own commands (needs `task`): one drawn from the task's command ranges at the
    start and again every episode of the task, as training drew them. A task with a tracked object and
    a success test also gets its object placed as training's reset does at every new episode, and each
    finished episode's outcome on the console (`q2real deploy --sim` pushing cube after cube)."""
    object_position: tuple[float, ...] = ()
    """Where the tracked object starts (x, y, z in the world, m); empty: where the task's scene puts it.
    The transfer gate's ROS 2 row starts each episode's object where its simulated episode started."""
    record_video: str | None = None
    """An MP4 the robot films its run to (rendered offscreen beside the physics loop, about 25 fps);
    None: no video."""


PERTURBATIONS = ("shift", "shift_at", "reset_every", "reset_spread")
"""The `SimRobotConfig` fields that perturb the robot, which `q2real deploy --sim` passes through."""


def add_perturbation_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The perturbation flags, declared once for the sim robot's command line and `q2real deploy`'s
    (`prefix` starts each help text there); defaults are `SimRobotConfig`'s."""
    defaults = SimRobotConfig()
    parser.add_argument(
        "--shift",
        action="extend",
        nargs="+",
        default=[],
        metavar="FIELD=VALUE",
        help=f"{prefix}a dynamics shift, e.g. actuator_gain_scale=0.5 (repeatable)",
    )
    parser.add_argument(
        "--shift-at", type=float, default=defaults.shift_at, help=f"{prefix}seconds after its first command"
    )
    parser.add_argument(
        "--reset-every", type=float, default=defaults.reset_every, help=f"{prefix}seconds between random joint resets"
    )
    parser.add_argument(
        "--command",
        dest="sim_command",  # `command` is the CLI's subcommand
        type=float,
        nargs="+",
        default=list(defaults.command),
        metavar="V",
        help=f"{prefix}a fixed task command to publish (a reach target x y z; forward, lateral, yaw speeds)",
    )
    parser.add_argument(
        "--reset-spread",
        type=float,
        default=defaults.reset_spread,
        help=f"{prefix}half-width (rad or m) of a reset around the default pose",
    )


def add_video_argument(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """`--record-video`, declared once for the sim robot's command line and `q2real deploy`'s."""
    parser.add_argument(
        "--record-video",
        metavar="MP4",
        default=None,
        help=f"{prefix}film the run to this MP4 (rendered offscreen; needs pip install 'q2real[video]')",
    )


def video_argv(args: argparse.Namespace) -> list[str]:
    """The sim robot's command-line flag for the video parsed into `args` (none if unset)."""
    return ["--record-video", args.record_video] if args.record_video else []


def perturbation_argv(args: argparse.Namespace) -> list[str]:
    """The sim robot's command-line flags for the perturbations and the fixed command parsed into
    `args` (none if unset)."""
    argv = ["--shift", *args.shift, "--shift-at", str(args.shift_at)] if args.shift else []
    if args.sim_command:
        argv += ["--command", *(repr(v) for v in args.sim_command)]
    if args.reset_every:
        argv += ["--reset-every", str(args.reset_every), "--reset-spread", str(args.reset_spread)]
    return argv
