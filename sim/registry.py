"""Named tasks and `make`: the one way to build an env from an `EnvConfig`."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from q2real.configs.loader import ConfigError
from q2real.sim.config import EnvConfig
from q2real.sim.task import Task, TaskConfig
from q2real.sim.tasks.arm_push import ArmPush
from q2real.sim.tasks.arm_reach import ArmReach
from q2real.sim.tasks.cartpole import CartpoleSwingup
from q2real.sim.tasks.gr1_joystick import GR1Joystick
from q2real.sim.tasks.gr1_legs_stand import GR1LegsStand
from q2real.sim.tasks.gr1_stand import GR1Stand
from q2real.sim.tasks.pendulum import PendulumSwingup
from q2real.sim.tasks.spot_joystick import SpotJoystick
from q2real.sim.tasks.velocity import HalfCheetahVelocity, HopperVelocity, Walker2dVelocity
from q2real.sim.vec_env import VecEnv

if TYPE_CHECKING:
    from q2real.sim.env import TaskEnv

TASKS: dict[str, type[Task]] = {
    "pendulum_swingup": PendulumSwingup,
    "cartpole_swingup": CartpoleSwingup,
    "panda_reach": ArmReach,
    "panda_push": ArmPush,
    "spot_joystick": SpotJoystick,
    "gr1_stand": GR1Stand,
    "gr1_legs_stand": GR1LegsStand,
    "gr1_joystick": GR1Joystick,
    "hopper_velocity": HopperVelocity,
    "walker2d_velocity": Walker2dVelocity,
    "half_cheetah_velocity": HalfCheetahVelocity,
}
ADAPTERS = {
    "gymnasium": "any gymnasium env with Box spaces, e.g. gymnasium:HalfCheetah-v5 (pip install 'q2real[gym]')",
    "playground": "a MuJoCo Playground env, e.g. playground:CartpoleSwingup (pip install 'q2real[playground]')",
    "robosuite": "a robosuite task with a Panda arm, e.g. robosuite:Lift or robosuite:Door (see the README to install)",
}


@dataclass(frozen=True)
class TaskInfo:
    name: str
    robot: str
    summary: str
    config: TaskConfig


def task_names() -> list[str]:
    return sorted(TASKS)


def default_config(name: str) -> TaskConfig:
    """The task's own settings (episode length, reward parameters) at their defaults."""
    return _task(name).Config()


def describe(name: str) -> TaskInfo:
    cls = _task(name)
    summary = (sys.modules[cls.__module__].__doc__ or "").strip()
    return TaskInfo(name, cls.robot, summary, cls.Config())


def _task(name: str) -> type[Task]:
    if name not in TASKS:
        raise ConfigError(
            f"env.task: unknown task '{name}'; registered: {task_names()}, or an adapter prefix: "
            f"{[p + ':<name>' for p in ADAPTERS]}"
        )
    return TASKS[name]


def make(config: EnvConfig | None = None, **changes) -> VecEnv:
    """Build the env a config names; keyword arguments override config fields (`make(task=..., num_envs=...)`)."""
    config = dataclasses.replace(config or EnvConfig(), **changes)
    prefix, _, rest = config.task.partition(":")
    for key in ("shield_in_loop", "shield_penalty"):
        if rest and getattr(config, key):
            raise ConfigError(f"env.{key}: needs a q2real task with a robot spec, not the adapter task {config.task!r}")
    if rest:
        if prefix == "gymnasium":
            from q2real.sim.adapters.gymnasium_env import GymnasiumEnv

            return GymnasiumEnv(rest, config)
        if prefix == "playground":
            from q2real.sim.adapters.playground_env import PlaygroundEnv

            return PlaygroundEnv(rest, config)
        if prefix == "robosuite":
            from q2real.sim.adapters.robosuite_env import RobosuiteEnv

            return RobosuiteEnv(rest, config)
        raise ConfigError(f"env.task: unknown adapter '{prefix}:' in '{config.task}'; known: {sorted(ADAPTERS)}")
    return make_task(config)


def make_task(config: EnvConfig | None = None, **changes) -> TaskEnv:
    """`make` for a registered q2real task (not an adapter), whose robot, physics and task internals are
    open to evaluation code."""
    from q2real.sim.env import TaskEnv

    config = dataclasses.replace(config or EnvConfig(), **changes)
    return TaskEnv(_task(config.task), config)
