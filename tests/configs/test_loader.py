from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from q2real.agents.config import TrainConfig
from q2real.agents.registry import LEARNERS
from q2real.configs.loader import ConfigError, list_presets, load, merge, parse_overrides, to_dict


@dataclass
class Inner:
    lr: float = 3e-4
    sizes: tuple[int, ...] = (256, 256)
    span: tuple[float, float] = (0.0, 1.0)


@dataclass
class Outer:
    name: str = "x"
    mode: Literal["a", "b"] = "a"
    steps: int = 10
    flag: bool = False
    limit: float | None = None
    inner: Inner = field(default_factory=Inner)


def test_layers_apply_in_order(tmp_path: Path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text("steps: 20\ninner:\n  lr: 1.0e-3\n")
    config = load(Outer, str(preset), ["inner.lr=5e-4", "inner.sizes=[64,64,64]", "limit=2"])
    assert config.steps == 20
    assert config.inner.lr == 5e-4
    assert config.inner.sizes == (64, 64, 64)
    assert config.limit == 2.0 and isinstance(config.limit, float)
    assert config.inner.span == (0.0, 1.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["stepz=3"], "command line: stepz: unknown key; Outer has"),
        (["inner.momentum=0.9"], "command line: inner.momentum: unknown key; Inner has"),
        (["steps=1.5"], "command line: steps: expected an integer, got 1.5"),
        (["flag=yes please"], "command line: flag: expected true or false"),
        (["mode=c"], "command line: mode: expected one of ['a', 'b'], got 'c'"),
        (["inner.span=[1,2,3]"], "command line: inner.span: expected 2 items, got 3"),
        (["inner.sizes=[64,x]"], "command line: inner.sizes[1]: expected an integer, got 'x'"),
        (["inner=3"], "command line: inner: expected a mapping"),
        (["steps"], "command line: 'steps': expected key=value"),
        (["limit=abc"], "command line: limit: expected a number, got 'abc'"),
    ],
)
def test_bad_overrides_name_key_and_source(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(Outer, None, overrides)
    assert message in str(err.value)


def test_preset_errors_name_the_file(tmp_path: Path) -> None:
    preset = tmp_path / "bad.yaml"
    preset.write_text("inner:\n  lr: fast\n")
    with pytest.raises(ConfigError, match=rf"{preset}: inner.lr: expected a number, got 'fast'"):
        load(Outer, str(preset))
    with pytest.raises(ConfigError, match="no shipped preset; shipped:"):
        load(Outer, "does_not_exist")


def test_round_trip_through_plain_dict() -> None:
    config = load(Outer, None, ["inner.sizes=[8]", "mode=b"])
    assert merge(Outer(), to_dict(config), "dict") == config


def test_parse_overrides_nests_and_parses_yaml() -> None:
    assert parse_overrides(["a.b=1", "a.c=[1, 2]", "d=true", "e="]) == {"a": {"b": 1, "c": [1, 2]}, "d": True, "e": ""}


@pytest.mark.parametrize("name", list_presets())
def test_shipped_presets_resolve(name: str) -> None:
    """Each as the job `q2real train --preset NAME` would run (a `residual:` section makes it residual RL)."""
    from q2real.agents.jobs import job_kind
    from q2real.residual.train import ResidualTrainConfig

    load(ResidualTrainConfig if job_kind(name, []) == "residual" else TrainConfig, name)


def test_the_residual_preset_is_a_residual_job() -> None:
    from q2real.agents.jobs import job_kind

    assert job_kind("residual_panda_push", []) == "residual"
    assert job_kind("sac_panda_push", ["residual.scale=0.2"]) == "residual"
    assert job_kind(None, ["algo=bc"]) == "bc" and job_kind("sac_panda_push", []) == "rl"


def test_env_task_params_are_checked_against_the_task_config() -> None:
    from q2real.sim import make

    with pytest.raises(ConfigError, match="env: task_params.episode_lenght: unknown key"):
        make(task="pendulum_swingup", num_envs=1, backend="mujoco", task_params={"episode_lenght": 3})


# --- one learner section ----------------------------------------------------------------------------------
def test_a_resolved_config_carries_only_its_learners_section() -> None:
    data = to_dict(load(TrainConfig, None, ["algo=td3", "td3.policy_delay=3"]))
    assert data["algo"] == "td3" and data["td3"]["policy_delay"] == 3
    assert not {"sac", "ddpg", "flashsac", "agent"} & set(data)


def test_choosing_a_learner_starts_its_section_from_defaults_in_any_key_order() -> None:
    first = load(TrainConfig, None, ["ddpg.batch_size=64", "algo=ddpg"])
    assert first.algo == "ddpg" and type(first.agent) is LEARNERS["ddpg"].config
    assert first.agent.batch_size == 64 and first.agent.num_critics == 1


def test_a_learner_section_for_another_algo_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="command line: td3: settings of algo 'td3', but algo is 'sac'; set algo=td3"):
        load(TrainConfig, None, ["td3.policy_delay=3"])
    preset = tmp_path / "p.yaml"
    preset.write_text("algo: sac\nflashsac:\n  tau: 0.1\n")
    with pytest.raises(ConfigError, match=rf"{preset}: flashsac: settings of algo 'flashsac'"):
        load(TrainConfig, str(preset))


def test_an_unknown_key_inside_the_learner_section_names_its_path() -> None:
    with pytest.raises(ConfigError, match="command line: sac.polcy_delay: unknown key; SACConfig has"):
        load(TrainConfig, None, ["sac.polcy_delay=2"])


def test_train_config_round_trips_through_yaml(tmp_path: Path) -> None:
    config = load(TrainConfig, None, ["algo=flashsac", "flashsac.actor_hidden=[8,8]", "total_steps=7"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    assert load(TrainConfig, str(path)) == config


def test_an_old_run_config_with_every_learners_section_still_loads(tmp_path: Path) -> None:
    """Before a config held one learner section, run directories carried all four learners of the time (not
    the ones registered since); the unused ones go."""
    data = to_dict(load(TrainConfig, None, ["algo=td3", "td3.policy_delay=4"]))
    for name in ("sac", "td3", "ddpg", "flashsac"):
        data.setdefault(name, to_dict(LEARNERS[name].config()))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    config = load(TrainConfig, str(path))
    assert config.algo == "td3" and config.agent.policy_delay == 4


def test_a_dotted_override_sets_one_task_param_on_top_of_the_presets() -> None:
    config = load(TrainConfig, "crossq_panda_push", ["env.task_params.action_rate=1.0"])
    assert config.env.task_params == {"observe_last_action": True, "action_rate": 1.0}
    again = load(TrainConfig, "crossq_panda_push", ["env.task_params.observe_last_action=false"])
    assert again.env.task_params == {"observe_last_action": False}
