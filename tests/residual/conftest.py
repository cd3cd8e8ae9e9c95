"""A small expert dataset and a BC base on it, made once per session: the residual tests start from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from q2real.agents.common.run_dir import LogConfig
from q2real.residual.bc import BCConfig, BCRun
from q2real.residual.dataset import write_lerobot
from q2real.residual.experts import make_expert
from q2real.residual.record import record
from q2real.sim import EnvConfig, make

REACH = EnvConfig(task="panda_reach", num_envs=4, seed=0, task_params={"sparse": True, "episode_length": 40})
"""Sparse reach with short episodes: the expert still succeeds in most of them, and everything is fast."""


def record_demos(env_config: EnvConfig, episodes: int, out: Path) -> Path:
    env = make(env_config)
    try:
        expert = make_expert(env_config.task, env)
        recorded = record(env, expert, episodes, env_config, "scripted expert", expert.reset)
    finally:
        env.close()
    return write_lerobot(recorded.demos, out)


@pytest.fixture(scope="session")
def reach_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_demos(REACH, 8, tmp_path_factory.mktemp("demos") / "reach")


@pytest.fixture(scope="session")
def reach_base(reach_demos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BC base (chunk 1), trained briefly: its quality does not matter to the tests that use it."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("runs")
    config = BCConfig(
        dataset=str(reach_demos),
        max_epochs=5,
        eval_episodes=2,
        log=LogConfig(root=str(root), name="bc", tensorboard=False),
    )
    return BCRun(config).run()
