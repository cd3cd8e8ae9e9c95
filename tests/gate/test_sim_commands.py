"""The sim robot publishes the task's commands as training drew them, or a fixed one, so a policy
that reads a command is never left on a made-up one in simulation."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from q2real.deploy_ros.transport import messages as msg
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


def _push_world(**settings) -> tuple[SimWorld, Commands]:
    config = SimRobotConfig(task="panda_push", task_commands=True, **settings)
    world = SimWorld(robot_spec("panda"), config)
    return world, Commands(world, config)


def _cube(world: SimWorld) -> np.ndarray:
    mujoco.mj_forward(world.model, world.data)
    return world.data.xpos[world.object_body].copy()


def test_every_push_episode_places_a_cube_as_training_does_and_judges_the_one_that_ends(capsys) -> None:
    world, commands = _push_world()
    episodes = commands.episodes
    assert episodes is not None
    first = list(commands.message(0.0).data)  # the node is still starting: this episode is not scored
    cubes = [_cube(world)]
    capsys.readouterr()
    episodes.running = True  # the node reports RUN on ~/mode
    episodes.step()
    target = list(commands.message(4.01).data)  # 200 steps at 50 Hz later
    out = capsys.readouterr().out
    assert target != first and out.index("episode 1 not judged") < out.index("task command")
    cubes.append(_cube(world))
    world.place_object((*target, 0.025))  # the policy pushed the cube onto the target
    episodes.step()
    commands.message(8.02)
    assert "episode 2 succeeded (1 of 1 so far)" in capsys.readouterr().out
    cubes.append(_cube(world))
    episodes.step()  # the cube stays where it was put: nowhere near the new target
    commands.message(12.03)
    assert "episode 3 failed (1 of 2 so far)" in capsys.readouterr().out
    world.place_object((*list(commands.message(12.04).data), 0.025))
    episodes.running = False  # an operator's stop, then a start again: not the policy's episode throughout
    episodes.step()
    episodes.running = True
    episodes.step()
    commands.message(16.05)
    assert "episode 4 not judged" in capsys.readouterr().out
    assert episodes.summary() == "sim robot: 1 of 2 judged episodes succeeded (5 begun)"
    for cube in [*cubes, _cube(world)]:  # ArmPushConfig's cube box, on the floor, clear of the arm
        assert 0.4 <= cube[0] <= 0.6 and -0.15 <= cube[1] <= 0.15 and cube[2] == pytest.approx(0.025)
    assert len({tuple(c) for c in cubes}) == len(cubes)
    assert not episodes._touches_robot()
    world.place_object(world.data.site_xpos[0])  # a cube put down inside the arm would be
    mujoco.mj_forward(world.model, world.data)
    assert episodes._touches_robot()


def test_the_object_starts_where_asked_and_a_bad_start_is_refused() -> None:
    config = SimRobotConfig(task="panda_push", command=(0.5, 0.2), object_position=(0.55, 0.1, 0.025))
    world = SimWorld(robot_spec("panda"), config)
    assert Commands(world, config).episodes is None  # a fixed command: the object stays where it is
    assert _cube(world) == pytest.approx([0.55, 0.1, 0.025])
    with pytest.raises(ValueError, match=r"object_position: expected 3 finite values x y z \(m\), got \[0.5, nan"):
        _push_world(object_position=(0.5, float("nan"), 0.025))
    reach = SimRobotConfig(task="panda_reach", object_position=(0.5, 0.0, 0.025))
    with pytest.raises(ValueError, match="object_position: needs a task with a tracked object"):
        SimWorld(robot_spec("panda"), reach)
    with pytest.raises(ValueError, match="object_position: the task's commands place the object every episode"):
        _push_world(object_position=(0.55, 0.1, 0.025))
