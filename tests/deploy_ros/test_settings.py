"""Every deploy and shield setting is range-checked before anything starts, and the refusal names the key,
whichever way the setting arrived: a preset or the command line, ROS parameters, or the Python API."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from q2real.cli.main import main
from q2real.configs.loader import ConfigError, load
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.settings import NodeConfig, config_from_parameters
from q2real.hardware import robot_spec
from q2real.safety.compiled import Shield
from q2real.safety.shield import ShieldConfig

BAD_SETTINGS = [
    ("control_period", -0.02),
    ("control_period", 0.0),
    ("control_period", math.inf),
    ("control_period", math.nan),
    ("control_period", 5.0),
    ("startup_timeout", 0.0),
    ("startup_timeout", math.nan),
    ("diagnostics_period", -1.0),
    ("extra_joints", ["gripper", "gripper"]),
    ("extra_joints", [""]),
    ("controller", "bad name"),
    ("controller", "ns/controller"),
    ("record", " "),
    ("robot", ""),
    ("topics.joint_states", "/bad//name"),
    ("topics.joint_states", "joint_states/"),
    ("topics.estop", "/joint_states"),
    ("topics.reset", "~/estop"),
    ("topics.task_command", "/diagnostics"),
    ("topics.command", "/joint_states"),
    ("topics.diagnostics", "/forward_command_controller/commands"),
    ("topics.estop", "/q2real_policy/reset"),
    ("topics.imu", "/joint_states"),
    ("topics.cmd_vel", "~/command"),
    ("topics.object_pose", "/imu/data"),
    ("topics.imu", "imu//data"),
    ("inputs.imu_max_age", 0.0),
    ("inputs.imu_max_age", math.nan),
    ("inputs.imu_max_age", 5.0),
    ("inputs.velocity_command_timeout", -1.0),
    ("inputs.velocity_command_timeout", math.inf),
    ("inputs.object_max_age", 1e9),
    ("inputs.max_angular_velocity", 0.0),
    ("inputs.max_angular_velocity", math.inf),
    ("inputs.max_object_distance", math.nan),
    ("shield.action_clip", 0.0),
    ("shield.action_clip", 1.5),
    ("shield.action_clip", math.nan),
    ("shield.action_scale", [math.nan]),
    ("shield.action_offset", [math.inf]),
    ("shield.soft_limit_margin", math.nan),
    ("shield.soft_limit_margin", -0.1),
    ("shield.soft_limit_margin", 0.5),
    ("shield.position_tolerance", -0.01),
    ("shield.position_tolerance", math.inf),
    ("shield.position_tolerance", 1e9),
    ("shield.velocity_fault_factor", 0.5),
    ("shield.max_state_age", 1e9),
    ("shield.max_deadline_misses", 10**18),
    ("startup_timeout", 1e300),
    ("startup_timeout", 10**400),
    ("shield.max_state_age", 0.0),
    ("shield.max_state_age", math.inf),
    ("shield.deadline", -0.001),
    ("shield.max_deadline_misses", 0),
    ("shield.max_bad_actions", -1),
    ("shield.ramp_time", -1.0),
    ("shield.ramp_time", math.nan),
    ("shield.ramp_max_distance", 0.0),
    ("shield.ramp_max_distance", math.inf),
    ("shield.ramp_time", 0.0),
    ("shield.ramp_max_distance", math.nan),
    ("shield.damp_kd", -1.0),
    ("shield.damp_kd", math.inf),
    ("shield.workspace_points", ["hand", "hand"]),
    ("shield.workspace_lower", [0.0, 0.0, math.nan]),
    ("shield.workspace_upper", [math.nan, 1.0, 1.0]),
]


def _nested(key: str, value) -> dict:
    *parents, leaf = key.split(".")
    data: dict = {leaf: value}
    for parent in reversed(parents):
        data = {parent: data}
    return data


def _yaml_value(value) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
    return repr(value) if isinstance(value, str) else str(value)


@pytest.mark.parametrize(("key", "value"), BAD_SETTINGS)
def test_bad_settings_are_refused_naming_the_key_on_every_path(key: str, value, pendulum_bundle) -> None:
    with pytest.raises(ConfigError) as err:
        load(NodeConfig, None, [f"{key}={_yaml_value(value)}"])
    assert "command line: " in str(err.value) and key.split(".")[-1] in str(err.value)
    parameters = {"policy.path": str(pendulum_bundle), key: value}
    with pytest.raises(ConfigError, match=rf"ROS parameters: .*{key.split('.')[-1]}"):
        config_from_parameters(parameters)


def test_the_node_and_the_shield_check_their_configs_themselves(pendulum_bundle) -> None:
    with pytest.raises(ValueError, match=r"shield\.damp_kd: expected a finite number >= 0, got -1\.0"):
        PolicyNode(pendulum_bundle, NodeConfig(shield=ShieldConfig(damp_kd=-1.0)))
    with pytest.raises(ValueError, match=r"topics\.estop: '/joint_states' is already the joint_states topic"):
        config = NodeConfig()
        config.topics = dataclasses.replace(config.topics, estop="/joint_states")
        PolicyNode(pendulum_bundle, config)
    spec = robot_spec("pendulum")
    with pytest.raises(ValueError, match=r"shield config: soft_limit_margin: expected a finite number"):
        Shield(spec, ShieldConfig(soft_limit_margin=math.nan))
    with pytest.raises(ValueError, match=r"shield config: deadline: .*<= 0\.02"):
        Shield(spec, ShieldConfig(deadline=0.5))


def test_the_cli_refuses_bad_settings_before_the_sim_robot_starts(pendulum_bundle, capsys, dds_domain) -> None:
    assert main(["deploy", str(pendulum_bundle), "--sim", "shield.damp_kd=-2"]) == 2
    assert "shield.damp_kd: expected a finite number >= 0, got -2.0" in capsys.readouterr().err


def test_good_settings_pass_and_a_sim_only_shield_may_skip_the_ramp() -> None:
    config = load(NodeConfig, None, ["control_period=0.01", "shield.ramp_time=0.5", "shield.max_state_age=0.2"])
    assert config.control_period == 0.01 and config.shield.ramp_time == 0.5
    # The transfer gate's shields start in RUN at once; the node's robot path never allows it.
    Shield(robot_spec("pendulum"), ShieldConfig(ramp_time=0.0, ramp_max_distance=math.inf))


def test_a_parameter_set_both_as_a_value_and_as_a_section_is_refused() -> None:
    with pytest.raises(ConfigError, match="ROS parameters: shield.ramp_time: 'shield' is set both"):
        config_from_parameters({"policy.path": "p.onnx", "shield": 1, "shield.ramp_time": 1.0})
    with pytest.raises(ConfigError, match="ROS parameters: shield: 'shield' is set both"):
        config_from_parameters({"policy.path": "p.onnx", "shield.ramp_time": 1.0, "shield": 1})


def test_the_node_leaves_the_config_it_was_handed_unchanged(pendulum_bundle) -> None:
    config = NodeConfig()
    node = PolicyNode(pendulum_bundle, config)
    assert config.shield.action_scale is None and config.shield.action_offset is None
    assert node.shield.scale.tolist() == [2.0]  # the bundle's mapping: pendulum effort limit


def test_the_ros2_packages_parameter_file_is_a_valid_node_config() -> None:
    """The shipped `config/policy.yaml` goes through the same strict parser as the node's parameters."""
    import yaml

    path = Path(__file__).resolve().parents[2] / "deploy_ros" / "ros2" / "config" / "policy.yaml"
    params = yaml.safe_load(path.read_text())["q2real_policy"]["ros__parameters"]

    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
        return out

    bundle, config = config_from_parameters(flat(params) | {"policy.path": "policy.onnx"})
    assert bundle == "policy.onnx" and config.require_subscriber and config.realtime.priority == 0
