"""Action-chunk critics: replay windows and their backups on a tiny MDP, each critic's loss against a
hand computation, causality of the multi-horizon critic, h = 1 as the per-step learner, settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from q2real.agents.algos.sac import SACConfig
from q2real.agents.algos.td3 import TD3Config
from q2real.agents.common.actor_critic import ActorCritic, Sizes
from q2real.agents.common.chunk_critics import CausalChunkCritic, ChunkConfig, expectile_loss
from q2real.agents.common.replay import ReplayStorage
from q2real.agents.config import TrainConfig
from q2real.agents.export import DeployPolicy, export_run, load_run_policy
from q2real.agents.registry import LEARNERS
from q2real.agents.train import Trainer, train
from q2real.configs.loader import ConfigError, load
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.gate.evaluation import evaluate_run
from q2real.sim.vec_env import StepResult

GAMMA = 0.9


def tiny_mdp() -> ReplayStorage:
    """One env, ten steps: obs t, action t / 10, reward t + 1, next obs t + 1; the episode terminates
    at t = 5 and is truncated at t = 7."""
    storage = ReplayStorage(20, 1, 1, 1, torch.device("cpu"))
    for t in range(10):
        result = StepResult(
            obs=torch.tensor([[t + 1.0]]),
            next_obs=torch.tensor([[t + 1.0]]),
            reward=torch.tensor([t + 1.0]),
            terminated=torch.tensor([t == 5]),
            truncated=torch.tensor([t == 7]),
            cost=torch.zeros(1),
            info={},
        )
        storage.add(torch.tensor([[float(t)]]), torch.tensor([[t / 10]]), result)
    return storage


def window(storage: ReplayStorage, row: int, chunk: int = 3):
    return storage.gather(torch.tensor([row]), torch.tensor([0]), chunk, GAMMA, chunk)


def test_a_chunk_window_is_the_hand_computed_h_step_backup_of_the_actions_taken() -> None:
    batch = window(tiny_mdp(), 1)
    assert batch.reward.item() == pytest.approx(2 + GAMMA * 3 + GAMMA**2 * 4)
    assert batch.discount.item() == pytest.approx(GAMMA**3)
    assert batch.next_obs.item() == 4.0
    assert batch.action[0].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert batch.prefixes is not None
    assert batch.prefixes.reward[0].tolist() == pytest.approx([2, 2 + GAMMA * 3, 2 + GAMMA * 3 + GAMMA**2 * 4])
    assert batch.prefixes.discount[0].tolist() == pytest.approx([GAMMA, GAMMA**2, GAMMA**3])
    assert batch.prefixes.next_obs.flatten().tolist() == [2.0, 3.0, 4.0]


def test_windows_stop_at_episode_ends_and_pad_with_the_last_action_taken() -> None:
    storage = tiny_mdp()
    terminal = window(storage, 4)  # steps 4, 5; the episode terminates at 5
    assert terminal.reward.item() == pytest.approx(5 + GAMMA * 6) and terminal.discount.item() == 0.0
    assert terminal.action[0].tolist() == pytest.approx([0.4, 0.5, 0.5])
    assert terminal.prefixes.discount[0].tolist() == pytest.approx([GAMMA, 0.0, 0.0])
    truncated = window(storage, 6)  # steps 6, 7; truncated at 7: bootstraps from its true next obs
    assert truncated.reward.item() == pytest.approx(7 + GAMMA * 8)
    assert truncated.discount.item() == pytest.approx(GAMMA**2) and truncated.next_obs.item() == 8.0
    assert truncated.action[0].tolist() == pytest.approx([0.6, 0.7, 0.7])
    newest = window(storage, 8)  # only rows 8, 9 exist yet: cut at the newest row
    assert newest.discount.item() == pytest.approx(GAMMA**2) and newest.next_obs.item() == 10.0


def test_a_windows_first_prefix_is_the_one_step_transition() -> None:
    storage = tiny_mdp()
    rows = torch.arange(9)
    chunked = storage.gather(rows, torch.zeros(9, dtype=torch.long), 3, GAMMA, 3)
    single = storage.gather(rows, torch.zeros(9, dtype=torch.long), 1, GAMMA, 1)
    assert chunked.prefixes is not None
    assert torch.equal(chunked.prefixes.reward[:, 0], single.reward)
    assert torch.equal(chunked.prefixes.discount[:, 0], single.discount)
    assert torch.equal(chunked.prefixes.next_obs[:, 0], single.next_obs)
    assert torch.equal(chunked.action[:, :1], single.action)


def agent(algo: str, **chunk) -> ActorCritic:
    torch.manual_seed(0)
    base = SACConfig() if algo == "sac" else TD3Config(target_noise=0.0)
    config = dataclasses.replace(
        base, actor_hidden=(8,), critic_hidden=(8,), normalize_obs=False, chunk=ChunkConfig(**chunk, width=8, heads=2)
    )
    return LEARNERS[algo].learner(config, Sizes(1, 1, 1, torch.device("cpu")))


def batch_of_windows(chunk: int = 3):
    storage = tiny_mdp()
    rows = torch.arange(9)
    return storage.gather(rows, torch.zeros(9, dtype=torch.long), chunk, GAMMA, chunk)


def test_the_qc_loss_is_the_h_step_td_error_against_the_next_chunk() -> None:
    learner, batch = agent("td3", size=3), batch_of_windows()
    with torch.no_grad():
        next_chunk = learner.actor_target(batch.next_obs)
        y = batch.reward + batch.discount * learner.critic_target(batch.next_obs, next_chunk).squeeze(-1).min(0).values
        expected = (learner.critic(batch.obs, batch.action).squeeze(-1) - y).pow(2).mean(1).sum()
        loss, td_abs = learner.td_loss(batch)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert td_abs.shape == (9,)


def test_the_multi_horizon_loss_regresses_every_prefix_to_its_own_backup() -> None:
    from q2real.agents.common.chunk_critics import multi_horizon_loss

    learner, batch = agent("td3", size=3, critic="multi", execute=2), batch_of_windows()
    prefixes = batch.prefixes
    with torch.no_grad():
        total = 0.0
        for k in range(3):  # prefix k + 1, bootstrapped from the executed prefix (2 actions) at s_{t+k+1}
            next_obs = prefixes.next_obs[:, k]
            v = learner.critic_target(next_obs, learner.actor_target(next_obs)[:, :2])[:, :, 1, 0].min(0).values
            y = prefixes.reward[:, k] + prefixes.discount[:, k] * v
            total += (learner.critic(batch.obs, batch.action)[:, :, k, 0] - y).pow(2).mean(1).sum() / 3
        loss, td_abs = multi_horizon_loss(learner, batch)
    assert loss.item() == pytest.approx(float(total), rel=1e-5)
    assert td_abs.shape == (9,)


def test_the_dqc_loss_is_the_chunk_backup_from_the_prefix_critic_plus_the_expectile_distillation() -> None:
    from q2real.agents.common.chunk_critics import decoupled_loss

    learner, batch = agent("td3", size=3, critic="dqc", policy_size=2, expectile=0.7), batch_of_windows()
    assert learner.prefix_critic is not None and learner.prefix_target is not None
    with torch.no_grad():
        v = learner.prefix_target(batch.next_obs, learner.actor_target(batch.next_obs)).squeeze(-1).min(0).values
        q = learner.critic(batch.obs, batch.action).squeeze(-1)
        chunk_loss = (q - (batch.reward + batch.discount * v)).pow(2).mean(1).sum()
        prefix_q = learner.prefix_critic(batch.obs, batch.action[:, :2]).squeeze(-1)
        u = q.min(0).values - prefix_q
        distill = (torch.where(u < 0, 0.3, 0.7) * u.pow(2)).mean(1).sum()
        loss, _ = decoupled_loss(learner, batch)
    assert loss.item() == pytest.approx((chunk_loss + distill).item(), rel=1e-6)
    assert learner.actor(batch.obs).shape == (9, 2)  # the policy predicts the prefix only


def test_expectile_loss_weights_under_and_over_estimates_asymmetrically() -> None:
    prediction, target = torch.tensor([[0.0, 0.0]]), torch.tensor([[2.0, -1.0]])
    assert expectile_loss(prediction, target, 0.8).item() == pytest.approx((0.8 * 4 + 0.2 * 1) / 2)


def test_the_causal_critic_values_a_prefix_without_looking_past_it() -> None:
    torch.manual_seed(0)
    critic = CausalChunkCritic(3, 2, 4, 2, 1, ChunkConfig(size=4, critic="multi", width=16, heads=4))
    obs, chunk = torch.randn(5, 3), torch.randn(5, 8)
    changed = chunk.clone()
    changed[:, 4:] = torch.randn(5, 4)  # actions 3 and 4
    out, out_changed = critic(obs, chunk), critic(obs, changed)
    assert out.shape == (2, 5, 4, 1)
    assert torch.allclose(out[:, :, :2], out_changed[:, :, :2], atol=1e-6)
    assert not torch.allclose(out[:, :, 2:], out_changed[:, :, 2:])
    assert torch.allclose(critic(obs, chunk[:, :4]), out[:, :, :2], atol=1e-6)  # the first two actions suffice


def small(tmp_path: Path, name: str, *extra: str) -> TrainConfig:
    return load(
        TrainConfig,
        None,
        [
            "env.num_envs=2",
            "env.task_params.episode_length=50",
            "total_steps=300",
            "warmup_steps=100",
            "eval_every=0",
            "eval_envs=2",
            "sac.actor_hidden=[16]",
            "sac.critic_hidden=[16]",
            "sac.batch_size=16",
            "sac.chunk.width=16",
            f"log.root={tmp_path}",
            f"log.name={name}",
            "log.tensorboard=false",
            "threads=1",
            *extra,
        ],
    )


def test_a_chunk_of_one_is_the_per_step_learner_exactly(tmp_path: Path) -> None:
    def trained(*extra: str) -> tuple[Trainer, dict[str, torch.Tensor]]:
        trainer = Trainer(small(tmp_path, extra[0] if extra else "plain", *extra[1:]))
        try:
            for _ in range(100):  # 2 envs, 100 warm-up steps: 51 updates
                trainer.collect()
                trainer.learn()
            return trainer, trainer.agent.state_dict()
        finally:
            trainer.env.close()
            trainer.eval_env.close()
            trainer.logger.close()

    _, plain = trained()
    one, chunked = trained("one", "sac.chunk.size=1", "sac.chunk.execute=1")
    assert one.chunks is None and one.agent.updates == 51
    assert all(torch.equal(plain[k], v) for k, v in chunked.items())


@pytest.mark.slow  # trains 300 steps and exports each chunk critic: near the fast tier's 5 s on a busy box
@pytest.mark.parametrize(
    "extra",
    [
        ("sac.chunk.size=3",),
        ("sac.chunk.size=4", "sac.chunk.critic=multi", "sac.chunk.execute=2", "sac.chunk.ensemble=0.1"),
        ("sac.chunk.size=4", "sac.chunk.critic=dqc", "sac.chunk.policy_size=2"),
    ],
    ids=["qc", "multi", "dqc"],
)
def test_a_chunk_policy_exports_with_parity_and_earns_its_torch_returns(tmp_path: Path, extra) -> None:
    run = train(small(tmp_path, "run", *extra)).path
    bundle = PolicyBundle(export_run(run))
    config, env, learner, _ = load_run_policy(run)
    env.close()
    spec = config.agent.chunk.spec()
    assert bundle.info.chunk == spec and bundle.info.metadata["chunk"]["dt"] == bundle.info.control_period
    obs = np.random.default_rng(1).normal(0, 2, (500, bundle.info.obs_dim)).astype(np.float32)
    with torch.no_grad():
        expected = DeployPolicy(learner, env)(torch.from_numpy(obs)).numpy()
    assert expected.shape == (500, spec.size, 1) and np.abs(bundle(obs) - expected).max() < 1e-5
    from_torch = evaluate_run(run, episodes=3, seed=4)
    from_bundle = evaluate_run(run, episodes=3, seed=4, bundle=run / "policy.onnx")
    assert torch.allclose(from_torch, from_bundle, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sac.chunk.size=0", "sac.chunk.size: expected in [1, 256]"),
        ("sac.chunk.critic=dqc", "sac.chunk.policy_size: expected in [1, size) for dqc"),
        ("sac.chunk.execute=9", "sac.chunk.execute: expected in [0, 4]"),
        ("sac.chunk.ensemble=3.0", "sac.chunk.ensemble: expected null or in [-1, 1]"),
        ("sac.n_step=3", "sac.n_step: expected 1 with chunks"),
        ("sac.critic_head=categorical", "sac.critic_head: expected scalar for chunk.critic dqc/multi"),
    ],
)
def test_chunk_settings_out_of_range_are_refused_naming_the_key(override: str, message: str) -> None:
    extra = ["sac.chunk.size=4", "sac.chunk.critic=multi"] if "critic_head" in override else ["sac.chunk.size=4"]
    with pytest.raises(ConfigError) as err:
        load(TrainConfig, None, [*extra, override])
    assert message in str(err.value)
