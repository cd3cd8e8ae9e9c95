"""The sim robot's settings, declared once: its config, whose fields are its command line's flags
(`q2real-sim-robot`), each field's docstring the flag's help; `q2real deploy --sim` takes the
perturbations, the fixed command and the video from the same declaration. Light to import (no
MuJoCo, no DDS), so building the CLI's parser costs nothing.

A flag is `--field-name`, typed by the field's annotation (a `bool` is a switch, a `Literal` a choice,
a tuple takes values one after the other, a dict NAME=VALUE items); a field declared with `flag(...)`
names its own flag or passes argparse what its annotation does not say.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from q2real.configs.docstrings import field_docs


def flag(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, **options: Any) -> Any:
    """A field whose flag is not just `--field-name` with its annotation's defaults: `name` (the flag) and
    argparse's own keywords (`nargs`, `metavar`, `dest`, `action`)."""
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata={"flag": options})
    return field(default=default, metadata={"flag": options})


@dataclass
class SimRobotConfig:
    rate: float | None = None
    """Joint-state and control rate in Hz; None: the spec's control rate."""
    command_style: Literal["forward", "trajectory"] = "forward"
    """The controller it plays: `forward` takes std_msgs/Float64MultiArray, `trajectory`
    trajectory_msgs/JointTrajectory."""
    joint_states_topic: str = "/joint_states"
    """Where it publishes sensor_msgs/JointState, as a joint_state_broadcaster does."""
    command_topic: str | None = None
    """Where it reads commands; None: the default topic of the command style's ros2_control controller."""
    command_timeout: float = 0.1
    """Seconds a drive keeps a command; without a fresher one it stops (zero effort, or a hold at the last
    target)."""
    drive_rate: float = 500.0
    """Hz at which the drives take the newest command (a ros2_control loop runs faster than the
    policy): physics steps are at most 1/drive_rate s, and a command acts from the first step after it
    arrives, so the node's latency, not a whole control period, separates a state from its command."""
    initial_qpos: dict[str, float] = flag(default_factory=dict, name="--initial", nargs="*", metavar="JOINT=VALUE")
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
    """Seed of its random draws: the IMU's bias and noise, the resets, the task's commands."""
    shift: dict[str, float] = flag(default_factory=dict, action="extend", nargs="+", metavar="FIELD=VALUE")
    """A dynamics shift, `q2real.sim.randomization.RandomizationConfig` fields and their values (e.g.
    actuator_gain_scale=0.5 payload=0.5), applied `shift_at` seconds after the first command."""
    shift_at: float = 0.0
    """Seconds after the first command at which the dynamics shift."""
    reset_every: float = 0.0
    """Seconds between two resets of the joints to the default pose plus U(-reset_spread, reset_spread)
    at rest, counted from the first command (someone knocking the robot about); 0: never."""
    reset_spread: float = 0.0
    """Half-width (rad or m) of a reset around the default pose."""
    command: tuple[float, ...] = flag((), dest="sim_command", metavar="V")  # `command` is the CLI's subcommand
    """A fixed task command to publish (a reach target, or forward, lateral and yaw speeds for a legged
    task); empty: none, unless `task_commands`."""
    task_commands: bool = False
    """Publish the task's own commands (needs `task`): one drawn from the task's command ranges at the
    start and again every episode of the task, as training drew them. A task with a tracked object and
    a success test also gets its object placed as training's reset does at every new episode, and each
    finished episode's outcome on the console (`q2real deploy --sim` pushing cube after cube)."""
    object_position: tuple[float, ...] = flag((), name="--object-at", nargs=3, metavar=("X", "Y", "Z"))
    """Where the tracked object starts (x, y, z in the world, m); empty: where the task's scene puts it.
    The transfer gate's ROS 2 row starts each episode's object where its simulated episode started."""
    record_video: str | None = flag(None, metavar="MP4")
    """An MP4 the robot films its run to (rendered offscreen beside the physics loop, about 25 fps;
    needs pip install 'q2real[video]'); None: no video."""


PERTURBATIONS = ("shift", "shift_at", "reset_every", "reset_spread")
"""The `SimRobotConfig` fields that perturb the robot, which `q2real deploy --sim` passes through."""
DEPLOY_FIELDS = (*PERTURBATIONS, "command", "record_video")
"""The `SimRobotConfig` fields `q2real deploy --sim` takes as flags of its own and passes through."""


def add_arguments(parser: argparse.ArgumentParser, names: Sequence[str] | None = None, prefix: str = "") -> None:
    """A flag per `SimRobotConfig` field (all, or those `names`), its default the field's and its help the
    field's docstring (after `prefix`)."""
    docs = field_docs(SimRobotConfig)
    for f, hint in _fields(names):
        options = dict(f.metadata.get("flag", {}))
        name = options.pop("name", "--" + f.name.replace("_", "-"))
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        keywords: dict[str, Any] = {**_keywords(hint, default), "dest": f.name, **options}
        help_text = (prefix + docs.get(f.name, "")).replace("%", "%%")  # argparse formats help with %
        parser.add_argument(name, help=help_text, **keywords)


def from_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SimRobotConfig:
    """The config the flags of `add_arguments` parsed into `args`; a malformed NAME=VALUE is `parser`'s error."""
    values: dict[str, Any] = {}
    for f, hint in _fields(None):
        options = f.metadata.get("flag", {})
        value = getattr(args, options.get("dest", f.name))
        if typing.get_origin(hint) is dict:
            value = _assignments(parser, options.get("name", "--" + f.name.replace("_", "-")), value)
        elif typing.get_origin(hint) is tuple:
            value = tuple(value)
        values[f.name] = value
    return SimRobotConfig(**values)


def _fields(names: Sequence[str] | None) -> Iterator[tuple[dataclasses.Field, Any]]:
    """(field, its type) of `SimRobotConfig`, in the order of `names` (default: declaration order)."""
    hints = typing.get_type_hints(SimRobotConfig)
    fields = {f.name: f for f in dataclasses.fields(SimRobotConfig)}
    for name in names if names is not None else fields:
        yield fields[name], hints[name]


def _keywords(hint: Any, default: Any) -> dict[str, Any]:
    """argparse's keywords for a flag of type `hint` and field default `default`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # `X | None`: a flag of X, default None
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    origin = typing.get_origin(hint)
    if hint is bool:
        return {"action": "store_true", "default": default}
    if origin is Literal:
        return {"choices": typing.get_args(hint), "default": default}
    if origin is tuple:
        return {"type": typing.get_args(hint)[0], "nargs": "+", "default": list(default)}
    if origin is dict:
        return {"nargs": "+", "metavar": "NAME=VALUE", "default": [f"{k}={v!r}" for k, v in default.items()]}
    return {"type": hint, "default": default}


def _assignments(parser: argparse.ArgumentParser, option: str, items: list[str]) -> dict[str, float]:
    """NAME=VALUE items as a dict of finite numbers."""
    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            values[name] = float(value) if sep and name else math.nan
        except ValueError:
            values[name] = math.nan
        if not math.isfinite(values[name]):
            parser.error(f"{option}: expected NAME=NUMBER, got {item!r:.80}")
    return values


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
