"""The sim robot's command line is its config: one flag per field, its docstring the help, and what
`q2real deploy --sim` passes through parses back into the same settings."""

from __future__ import annotations

import argparse
import dataclasses

from q2real.configs.docstrings import field_docs
from q2real.gate.sim_settings import (
    DEPLOY_FIELDS,
    SimRobotConfig,
    add_arguments,
    from_arguments,
    perturbation_argv,
    video_argv,
)


def _parser(names: tuple[str, ...] | None = None, prefix: str = "") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="q2real-sim-robot", exit_on_error=False)
    add_arguments(parser, names, prefix)
    return parser


def test_every_setting_is_a_flag_with_its_docstring_as_help() -> None:
    helps = {action.dest: action.help for action in _parser()._actions}
    docs = field_docs(SimRobotConfig)
    for f in dataclasses.fields(SimRobotConfig):
        dest = f.metadata.get("flag", {}).get("dest", f.name)
        assert docs.get(f.name), f"SimRobotConfig.{f.name}: a setting needs a docstring, its flag's help"
        assert helps.get(dest) == docs[f.name], f"SimRobotConfig.{f.name}: no flag, or another help"


def test_no_flags_is_the_default_config_and_flags_parse_into_their_fields() -> None:
    parser = _parser()
    assert from_arguments(parser, parser.parse_args([])) == SimRobotConfig()
    argv = ["--rate", "50", "--command-style", "trajectory", "--initial", "hinge=0.5", "--seed", "3"]
    argv += ["--shift", "payload=0.5", "--shift", "actuator_gain_scale=2", "--command", "0.1", "0.2"]
    argv += ["--task-commands", "--object-at", "1", "2", "3", "--record-video", "run.mp4"]
    assert from_arguments(parser, parser.parse_args(argv)) == SimRobotConfig(
        rate=50.0,
        command_style="trajectory",
        initial_qpos={"hinge": 0.5},
        seed=3,
        shift={"payload": 0.5, "actuator_gain_scale": 2.0},
        command=(0.1, 0.2),
        task_commands=True,
        object_position=(1.0, 2.0, 3.0),
        record_video="run.mp4",
    )


def test_what_deploy_passes_through_reaches_the_sim_robot_unchanged() -> None:
    deploy = _parser(DEPLOY_FIELDS, "[sim robot] ")
    argv = ["--shift", "payload=0.5", "--shift-at", "2", "--reset-every", "8", "--reset-spread", "0.1"]
    args = deploy.parse_args([*argv, "--command", "0.3", "--record-video", "run.mp4"])
    robot = _parser()
    config = from_arguments(robot, robot.parse_args(perturbation_argv(args) + video_argv(args)))
    assert config == SimRobotConfig(
        shift={"payload": 0.5}, shift_at=2.0, reset_every=8.0, reset_spread=0.1, command=(0.3,), record_video="run.mp4"
    )
