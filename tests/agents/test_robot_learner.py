"""The learner beside the node turns the node's rows into transitions: the task's reward rebuilt from
the stream (arms included), or the values of the node's reward input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from q2real.agents.onrobot.finetune import FinetuneConfig, Finetuner
from q2real.agents.onrobot.robot_learner import RobotLearner, learner_config
from q2real.agents.train import train
from q2real.configs.loader import ConfigError, load
from q2real.contracts.transitions import GOOD, RING, ROLLBACK, RUN, TransitionRing
from q2real.sim import make
from tests.conftest import FIXTURE_RUN


def _learner(tmp_path: Path, run: Path, ring_dims: tuple[int, int, int], *overrides: str) -> RobotLearner:
    ring = tmp_path / "ft"
    ring.mkdir()
    TransitionRing(ring / RING, 4096, *ring_dims, create=True)
    settings = [f"run={run}", f"log.root={tmp_path / 'runs'}", "log.tensorboard=false", "eval_every=0", "eval_envs=1"]
    return RobotLearner(load(FinetuneConfig, None, [*settings, *overrides]), ring, publish_every=60.0)


def _pending_rewards(learner: RobotLearner) -> list[float]:
    return [float(entry[2]) for entry in learner._pending]


def test_with_reward_topic_the_inputs_values_are_the_rewards_and_rows_without_one_are_skipped(tmp_path: Path) -> None:
    learner = _learner(tmp_path, FIXTURE_RUN, (3, 1, 1), "reward=topic")
    ring = learner.ring
    rewards_in = [np.nan, 0.25, np.nan, -1.5, 2.0]  # row k's value: the reward of the transition k-1 -> k
    for tick, value in enumerate(rewards_in):
        ring.append(tick, np.full(3, 0.1 * tick), np.array([0.5]), np.array([0.1]), np.array([0.0]), 0, RUN, value)
    learner._fill()
    assert _pending_rewards(learner) == [0.25, -1.5, 2.0]
    written, _, rewarded = ring.rewards_since(0)
    assert rewarded == 4 and np.array_equal(written, np.float32([0.25, np.nan, -1.5, 2.0]), equal_nan=True)
    obs, _, _, next_obs, _ = learner._pending[1]
    assert torch.allclose(obs, torch.full((1, 3), 0.2)) and torch.allclose(next_obs, torch.full((1, 3), 0.3))
    learner.env.close()
    learner.eval_env.close()


def test_rewards_reach_the_node_at_the_robots_pace_however_far_behind_the_updates_are(tmp_path: Path) -> None:
    """The node judges a version on trial by the learner's rewards: each transition the learner takes in
    rewards every row written since, not only the one it learns from next."""
    learner = _learner(tmp_path, FIXTURE_RUN, (3, 1, 1), "reward=topic")
    ring = learner.ring
    for tick in range(200):
        ring.append(tick, np.zeros(3), np.array([0.5]), np.array([0.1]), np.array([0.0]), 0, RUN, 1.0)
    learner.collect()
    assert learner.step == 1 and ring.rewarded == 199
    for tick in range(200, 260):
        ring.append(tick, np.zeros(3), np.array([0.5]), np.array([0.1]), np.array([0.0]), 0, RUN, 1.0)
    learner.collect()
    assert learner.step == 2 and ring.rewarded == 259, "the second transition's turn rewarded all 60 new rows"
    learner.env.close()
    learner.eval_env.close()


def test_reward_topic_is_refused_in_simulation() -> None:
    with pytest.raises(ConfigError, match="reward: 'topic' is the deploy node's reward input"):
        Finetuner(load(FinetuneConfig, None, [f"run={FIXTURE_RUN}", "reward=topic"]))


@pytest.fixture(scope="module")
def reach_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A panda_reach SAC run of a few hundred steps: what matters is its task, not its skill."""
    root = tmp_path_factory.mktemp("reach")
    overrides = [
        "env.task=panda_reach", "env.shield_penalty=3", "env.num_envs=2", "total_steps=100", "warmup_steps=100",
        "eval_every=0",
        "eval_envs=1", "sac.actor_hidden=[16]", "sac.critic_hidden=[16]", f"log.root={root}", "log.name=run",
        "log.tensorboard=false",
    ]  # fmt: skip
    from q2real.agents.config import TrainConfig

    train(load(TrainConfig, None, overrides))
    return root / "run"


@pytest.mark.slow  # trains a tiny panda_reach run and builds its fine-tuning learner: about 10 s
def test_an_arm_is_fine_tuned_on_the_task_reward_rebuilt_from_the_stream(tmp_path: Path, reach_run: Path) -> None:
    """Rows as the node writes them for the sim arm (joint states, the observation with its target):
    the learner's rewards are the simulator's for the same states, less the run's charge for what the
    shield changed (the policy asked for 0.2 more than it was sent on every joint), and the
    transitions hold the action the policy asked for, as the run's replay did."""
    env = make(task="panda_reach", num_envs=1, device="cpu", backend="mujoco")
    learner = _learner(tmp_path, reach_run, (env.obs_dim, env.action_dim, 7))
    obs, ring, expected, asked = env.reset(seed=5), learner.ring, [], []
    gen = torch.Generator().manual_seed(1)
    for tick in range(12):
        action = torch.rand(1, env.action_dim, generator=gen) * 2 - 1
        task = env.task
        q, qd = env.physics.qpos[0, task.qpos_index].numpy(), env.physics.qvel[0, task.qvel_index].numpy()
        wanted = (action[0] + 0.2).clamp(-1, 1)
        ring.append(tick, obs[0].numpy(), action[0].numpy(), q, qd, 0, RUN, wanted=wanted.numpy())
        result = env.step(action)
        obs = result.next_obs
        expected.append(float(result.reward[0]) - 3.0 * float((wanted - action[0]).abs().mean()))
        asked.append(wanted)
    learner._fill()
    assert np.allclose(_pending_rewards(learner), expected[:-1], atol=2e-3)  # 11 pairs of consecutive rows
    assert all(torch.allclose(entry[1][0], want) for entry, want in zip(learner._pending, asked, strict=False))
    env.close()
    learner.env.close()
    learner.eval_env.close()


@pytest.mark.parametrize("text, kind", [("algo: bc\n", "bc"), ("algo: sac\nresidual:\n  base: runs/bc\n", "residual")])
def test_a_run_of_another_kind_is_refused_naming_its_kind(tmp_path: Path, text: str, kind: str) -> None:
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match=rf"is a {kind} run; fine-tuning continues an off-policy RL run"):
        Finetuner(load(FinetuneConfig, None, [f"run={tmp_path}"]))


def test_beside_the_robot_the_actor_is_anchored_unless_the_node_says_otherwise() -> None:
    assert learner_config([f"run={FIXTURE_RUN}"]).anchor == 20.0
    assert learner_config([f"run={FIXTURE_RUN}", "anchor=0"]).anchor == 0.0
    assert load(FinetuneConfig, None, [f"run={FIXTURE_RUN}"]).anchor == 0.0  # `q2real finetune`'s own default


def test_the_learner_anchors_to_the_version_the_node_judged_good(tmp_path: Path) -> None:
    """The handed-over policy is the anchor until the node names another good version (`good.json`),
    whose saved actor the anchor then runs; a rollback reloads the actor and anchors to it as well."""
    learner = _learner(tmp_path, FIXTURE_RUN, (3, 1, 1), "anchor=5")
    agent, anchor = learner.agent, learner.agent.anchor
    assert anchor is not None
    probe = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
    handed_over = agent.act(probe, deterministic=True)
    publisher = next(c for c in learner.callbacks if type(c).__name__ == "Publisher")
    publisher.on_start(learner)  # saves version 0, the handed-over policy
    with torch.no_grad():
        for p in agent.policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    learner.save_actor(1)
    moved = agent.act(probe, deterministic=True)
    assert torch.allclose(anchor(probe), handed_over, atol=1e-6) and not torch.allclose(moved, handed_over, atol=1e-2)
    (learner.directory / GOOD).write_text(json.dumps({"version": 1}))
    publisher.on_iteration(learner)
    assert torch.allclose(anchor(probe), moved, atol=1e-6)
    (learner.directory / ROLLBACK).write_text(json.dumps({"version": 0, "refused": 2, "reason": "worse"}))
    (learner.directory / GOOD).write_text(json.dumps({"version": 0}))
    publisher.on_iteration(learner)
    assert torch.allclose(anchor(probe), handed_over, atol=1e-6)
    assert torch.allclose(agent.act(probe, deterministic=True), handed_over, atol=1e-6)
    learner.env.close()
    learner.eval_env.close()
