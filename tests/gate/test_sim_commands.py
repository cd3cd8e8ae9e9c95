"""The sim robot publishes the task's commands as training drew them, or a fixed one, so a policy
that reads a command is never left on a made-up one in simulation."""

from __future__ import annotations

import pytest

from q2real.deploy_ros import messages as msg
from q2real.gate.sim_robot import Commands, SimWorld
from q2real.gate.sim_settings import SimRobotConfig
from q2real.hardware import robot_spec


def test_a_reach_target_per_episode_from_the_tasks_box() -> None:
    world = SimWorld(robot_spec("panda"), SimRobotConfig(task="panda_reach", task_commands=True))
    commands = Commands(world, SimRobotConfig(task="panda_reach", task_commands=True))
    first = commands.message(0.0)
    assert isinstance(first, msg.Float64MultiArray) and len(first.data) == 3
    low, high = (0.3, -0.3, 0.2), (0.6, 0.3, 0.6)  # ArmReachConfig's target box
    assert all(lo <= v <= hi for v, lo, hi in zip(first.data, low, high, strict=True))
    episode = 100 * 0.02  # 100 steps at 50 Hz
    assert list(commands.message(episode - 0.01).data) == list(first.data)
    assert list(commands.message(episode + 0.01).data) != list(first.data)


def test_a_legged_task_gets_velocities_on_cmd_vel_and_a_fixed_command_is_checked() -> None:
    config = SimRobotConfig(task="spot_joystick", command=(0.5, 0.0, 0.2))
    commands = Commands(SimWorld(robot_spec("spot"), config), config)
    twist = commands.message(0.0)
    assert isinstance(twist, msg.Twist) and (twist.linear.x, twist.linear.y, twist.angular.z) == (0.5, 0.0, 0.2)
    wrong = SimRobotConfig(task="spot_joystick", command=(0.5,))
    with pytest.raises(ValueError, match="command: spot_joystick takes 3 values, got 1"):
        Commands(SimWorld(robot_spec("spot"), wrong), wrong)


def test_spots_joystick_changes_every_5_s_as_in_training() -> None:
    config = SimRobotConfig(task="spot_joystick", task_commands=True)
    commands = Commands(SimWorld(robot_spec("spot"), config), config)
    first = commands.message(0.0)
    assert isinstance(first, msg.Twist)
    assert commands.message(4.99).linear.x == first.linear.x  # command_every: 250 steps at 50 Hz
    later = [commands.message(5.0 * k + 0.01) for k in range(1, 6)]
    assert len({(t.linear.x, t.linear.y, t.angular.z) for t in [first, *later]}) >= 5
