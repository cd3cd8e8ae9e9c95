"""Shared fixtures. MJX tests compile XLA programs, so envs are built once per module and kept small."""

from __future__ import annotations

import os

import pytest

SLOW_FIXTURES = {"trained_pendulum", "trained_bundle"}
"""Fixtures that train to a return threshold: every test using one is in the slow tier."""

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """MJX compiles and trained-policy fixtures make a test slow wherever it lives."""
    for item in items:
        if item.get_closest_marker("mjx") or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def trained_pendulum(tmp_path_factory: pytest.TempPathFactory):
    """SAC trained on pendulum swing-up until its evaluation return reaches 300 (about 100 s on 2 cores).

    Shared by the SAC learning test and the end-to-end deploy test, so the suite trains it once.
    """
    from q2real.agents.config import TrainConfig
    from q2real.agents.train import train
    from q2real.configs.loader import load

    overrides = [
        "algo=sac",
        "total_steps=35000",
        "eval_every=5000",
        "stop_return=300",
        "threads=2",
        f"log.root={tmp_path_factory.mktemp('trained')}",
        "log.name=sac-pendulum",
        "log.tensorboard=false",
        "sac.actor_hidden=[128,128]",
        "sac.critic_hidden=[128,128]",
    ]
    return train(load(TrainConfig, None, overrides))
