"""Scripted experts, the recorder and behaviour cloning."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from q2real.agents.common.run_dir import LogConfig
from q2real.configs.loader import ConfigError
from q2real.residual.bc import BCConfig, BCRun, chunk_targets, export_bc, load_bc
from q2real.residual.dataset import Demos, read_lerobot
from q2real.residual.experts import make_expert
from q2real.residual.record import record
from q2real.sim import EnvConfig, make
from tests.residual.conftest import REACH


@pytest.mark.parametrize(("task", "floor"), [("panda_reach", 0.85), ("panda_push", 0.3)])
def test_scripted_experts_succeed(task: str, floor: float) -> None:
    config = EnvConfig(task=task, num_envs=16, seed=5)
    env = make(config)
    try:
        expert = make_expert(task, env)
        recorded = record(env, expert, 16, config, "expert", expert.reset, seed=5)
    finally:
        env.close()
    assert recorded.success_rate >= floor
    demos = recorded.demos
    assert demos.num_episodes == 16 and demos.obs.shape[1] == env.obs_dim
    assert np.abs(demos.action).max() <= 1.0
    assert demos.q2real["success_rate"] == recorded.success_rate


def test_recording_only_successes_keeps_only_successes() -> None:
    env = make(REACH)
    try:
        expert = make_expert("panda_reach", env)
        recorded = record(env, expert, 6, REACH, "expert", expert.reset, successful_only=True)
    finally:
        env.close()
    assert recorded.demos.num_episodes == 6 and recorded.demos.episode_success().all()
    assert (np.diff(recorded.demos.bounds(), axis=1) == 40).all()


def test_chunk_targets_repeat_the_last_action_past_the_episode() -> None:
    action = np.arange(10, dtype=np.float32)[:, None]
    demos = Demos(obs=action.copy(), action=action, episode=np.repeat([0, 1], [4, 6]), fps=10.0)
    targets = chunk_targets(demos, 3)
    np.testing.assert_array_equal(targets[2], [2, 3, 3])
    np.testing.assert_array_equal(targets[3], [3, 3, 3])
    np.testing.assert_array_equal(targets[4], [4, 5, 6])


def test_bc_fits_its_demonstrations_and_exports(tmp_path: Path, reach_demos: Path) -> None:
    config = BCConfig(
        dataset=str(reach_demos),
        chunk=2,
        max_epochs=40,
        patience=40,
        eval_episodes=2,
        val_fraction=0.25,
        log=LogConfig(root=str(tmp_path), name="bc", tensorboard=False),
    )
    run = BCRun(config)
    assert run.config.env.task == "panda_reach" and run.config.env.task_params == REACH.task_params
    path = run.run()
    records = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["bc/train_loss"] for r in records if "bc/train_loss" in r]
    assert losses[-1] < 0.3 * losses[0]
    _, policy, state = load_bc(path)
    demos = read_lerobot(reach_demos)
    # The normalizer carries the training split's statistics, not identity.
    assert not torch.allclose(policy.obs_norm.mean, torch.zeros(17))
    assert state["episodes"] == demos.num_episodes
    bundle = export_bc(path)
    session = ort.InferenceSession(str(bundle), providers=["CPUExecutionProvider"])
    commands = session.run(None, {"obs": demos.obs[:32]})[0]
    env = make(dataclasses.replace(run.config.env, num_envs=1, device="cpu"))
    with torch.no_grad():
        actions = policy(torch.from_numpy(demos.obs[:32])).clamp(-1, 1).view(32, 2, 7)
    expected = env.action_offset + env.action_scale * actions
    env.close()
    assert commands.shape == (32, 2, 7)
    np.testing.assert_allclose(commands, expected.numpy(), atol=1e-5, rtol=0)
    meta = json.loads(bundle.with_suffix(".onnx.json").read_text())
    assert meta["training"]["algo"] == "bc" and meta["chunk"]["size"] == 2


def test_bc_refuses_bad_settings(tmp_path: Path, reach_demos: Path) -> None:
    with pytest.raises(ConfigError, match="dataset: expected a LeRobotDataset folder"):
        BCRun(BCConfig())
    with pytest.raises(ConfigError, match="execute: expected an integer in"):
        BCRun(BCConfig(dataset=str(reach_demos), chunk=2, execute=3))
    wrong = BCConfig(dataset=str(reach_demos), env=EnvConfig(task="pendulum_swingup", num_envs=1))
    with pytest.raises(ConfigError, match="dataset: .* has observations of 17 and actions of 7"):
        BCRun(wrong)


@pytest.mark.slow
def test_bc_learns_the_reach_expert(tmp_path: Path) -> None:
    """Bounded: 40 expert episodes of sparse reach, cloned; the clone succeeds in most episodes."""
    from tests.residual.conftest import record_demos

    env = dataclasses.replace(REACH, task_params={"sparse": True}, num_envs=8)
    demos = record_demos(env, 40, tmp_path / "demos")
    run = BCRun(BCConfig(dataset=str(demos), eval_episodes=32, log=LogConfig(root=str(tmp_path), tensorboard=False)))
    run.run()
    assert run.eval_success is not None and run.eval_success >= 0.7
