"""The learner registry is the one list of learners: the command line's `algo` choices, the training job,
the learner built and the config reference all follow it."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import pytest
import torch
import yaml

from q2real.agents.algos.sac import SAC, SACConfig
from q2real.agents.config import TrainConfig
from q2real.agents.jobs import job_kind
from q2real.agents.learners import build_agent
from q2real.agents.registry import LEARNERS, OTHER_JOBS, LearnerSpec
from q2real.cli.config_reference import Reference
from q2real.cli.main import main
from q2real.configs.loader import ConfigError, load
from q2real.sim import make


@dataclass
class ToyConfig(SACConfig):
    knob: int = 3
    """A setting only this learner has."""


class Toy(SAC):
    config: ToyConfig


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(LEARNERS, "toy", LearnerSpec(ToyConfig, Toy))


@pytest.mark.usefixtures("toy")
def test_a_learner_registered_later_is_an_algo_of_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "algo=toy", "toy.knob=5", "toy.actor_hidden=[8]", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["algo"] == "toy" and printed["toy"]["knob"] == 5 and printed["toy"]["actor_hidden"] == [8]
    assert job_kind(None, ["algo=toy"]) == "rl"


@pytest.mark.usefixtures("toy")
def test_a_learner_registered_later_is_built_and_documented() -> None:
    config = load(TrainConfig, None, ["algo=toy", "toy.actor_hidden=[8]", "toy.critic_hidden=[8]"])
    env = make(dataclasses.replace(config.env, num_envs=1, device="cpu"))
    try:
        agent = build_agent(config, env)
    finally:
        env.close()
    assert type(agent) is Toy and agent.device == torch.device("cpu")
    entries = {entry.key: entry for entry in Reference().parts["train"].entries}
    assert '"toy"' in entries["algo"].type and ToyConfig in entries["<algo>"].sections


def test_every_registered_name_is_an_algo_and_nothing_else() -> None:
    for name, learner in LEARNERS.items():
        assert type(load(TrainConfig, None, [f"algo={name}"]).agent) is learner.config
    refused = f"command line: algo: expected one of {list(LEARNERS)}, got 'toy'"
    with pytest.raises(ConfigError, match=re.escape(refused)):
        load(TrainConfig, None, ["algo=toy"])
    with pytest.raises(ValueError, match="algo: expected one of"):
        TrainConfig(algo="toy").validate()


def test_each_algo_chooses_its_job() -> None:
    assert not set(LEARNERS) & set(OTHER_JOBS)
    assert {name: job_kind(None, [f"algo={name}"]) for name in LEARNERS} == dict.fromkeys(LEARNERS, "rl")
    assert {name: job_kind(None, [f"algo={name}"]) for name in OTHER_JOBS} == OTHER_JOBS
    assert job_kind(None, ["algo=sac", "residual.scale=0.2"]) == "residual"
