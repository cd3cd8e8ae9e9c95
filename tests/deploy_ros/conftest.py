"""Deploy fixtures: bundles exported from real (trained or freshly initialised) agents, and DDS kept on
loopback with a separate domain per test so that processes of one test never hear another's."""

from __future__ import annotations

import dataclasses
import itertools
import os
from pathlib import Path

import pytest

from q2real.deploy_ros.transport.dds import LOOPBACK

os.environ.setdefault("CYCLONEDDS_URI", LOOPBACK)
# ROS 2 peers (rclpy on Fast DDS) stay on loopback too; Jazzy reads the FASTRTPS_ name, Kilted FASTDDS_.
FAST_DDS_LOOPBACK = str(Path(__file__).resolve().parents[1] / "fixtures" / "fastdds_loopback.xml")
os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", FAST_DDS_LOOPBACK)
os.environ.setdefault("FASTRTPS_DEFAULT_PROFILES_FILE", FAST_DDS_LOOPBACK)
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
_domains = itertools.count(100 + 66 * (_WORKER % 2) + os.getpid() % 30)
"""Domains 100-232 (DDS's last), a half for each of two pytest-xdist workers, offset by the pid so that
two pytest runs side by side seldom meet."""


def export_fresh_agent(
    task: str, output: Path, task_params: dict | None = None, chunk=None, edit_agent=None, algo: str = "sac"
) -> Path:
    """A bundle of an untrained agent: real graph and metadata, arbitrary actions (a chunk policy's with
    `chunk`, a `ChunkConfig`; `edit_agent(agent)` may set its weights first)."""
    from q2real.agents.config import TrainConfig
    from q2real.agents.export import write_bundle
    from q2real.agents.learners import build_agent
    from q2real.agents.registry import LEARNERS
    from q2real.sim import make

    config = TrainConfig(algo=algo, agent=LEARNERS[algo].config())
    env_config = dataclasses.replace(config.env, task=task, num_envs=1, device="cpu", task_params=task_params or {})
    config = dataclasses.replace(config, env=env_config)
    if chunk is not None:
        config = dataclasses.replace(config, agent=dataclasses.replace(config.agent, chunk=chunk))
    env = make(config.env)
    try:
        agent = build_agent(config, env)
        if edit_agent is not None:
            edit_agent(agent)
        return write_bundle(config, env, agent, 0, output)
    finally:
        env.close()


@pytest.fixture(scope="session")
def pendulum_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_fresh_agent("pendulum_swingup", tmp_path_factory.mktemp("bundles") / "pendulum.onnx")


@pytest.fixture(scope="session")
def cartpole_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_fresh_agent("cartpole_swingup", tmp_path_factory.mktemp("bundles") / "cartpole.onnx")


@pytest.fixture(scope="session")
def panda_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Seven position-controlled joints: every per-joint robot rule has joints to break."""
    return export_fresh_agent("panda_reach", tmp_path_factory.mktemp("bundles") / "panda.onnx")


@pytest.fixture(scope="session")
def spot_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A legged robot's policy: base IMU, cmd_vel and joints around the default stance."""
    return export_fresh_agent("spot_joystick", tmp_path_factory.mktemp("bundles") / "spot.onnx")


@pytest.fixture(scope="session")
def push_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An arm policy that observes a tracked object and its pusher by forward kinematics."""
    return export_fresh_agent("panda_push", tmp_path_factory.mktemp("bundles") / "push.onnx")


@pytest.fixture(scope="session")
def trained_bundle(pendulum_run: Path) -> Path:
    """The committed trained run's bundle: it swings the pendulum up."""
    return pendulum_run / "policy.onnx"


@pytest.fixture
def participant(dds_domain: int):
    """Factory of DDS participants in this test's domain, all deleted at teardown (see Endpoints.close)."""
    from q2real.deploy_ros.transport.dds import Endpoints

    made: list[Endpoints] = []

    def make(node: str) -> Endpoints:
        made.append(Endpoints(dds_domain, node=node))
        return made[-1]

    yield make
    for endpoints in reversed(made):
        endpoints.close()


@pytest.fixture
def dds_domain(monkeypatch: pytest.MonkeyPatch) -> int:
    """A DDS domain of this test's own (child processes inherit it through ROS_DOMAIN_ID)."""
    domain = next(_domains)
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    return domain
