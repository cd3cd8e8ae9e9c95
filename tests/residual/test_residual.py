"""Residual RL on a BC base: exact base behaviour at init, the bound, RLPD's batches, the one-graph bundle."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from q2real.agents.algos.sac import SACConfig
from q2real.agents.callbacks import evaluate
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.chunk_critics import ChunkConfig
from q2real.agents.common.replay import ReplayStorage
from q2real.agents.common.run_dir import LogConfig
from q2real.configs.loader import ConfigError
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.residual.bc import BCConfig, BCRun, load_bc
from q2real.residual.dataset import Demos, read_lerobot
from q2real.residual.demo_replay import DemoMixSampler, demo_storage
from q2real.residual.export import ResidualGraph, export_residual, load_residual_run
from q2real.residual.learner import ResidualConfig, ResidualSAC
from q2real.residual.train import ResidualTrainConfig, ResidualTrainer
from q2real.sim import make
from tests.residual.conftest import REACH


def _config(tmp_path: Path, base: Path | None, demos: Path | None, **residual) -> ResidualTrainConfig:
    return ResidualTrainConfig(
        env=dataclasses.replace(REACH, num_envs=2),
        log=LogConfig(root=str(tmp_path), tensorboard=False, interval_steps=100),
        agent=SACConfig(
            actor_hidden=(32, 32),
            critic_hidden=(32, 32),
            batch_size=32,
            num_critics=4,
            target_subset=2,
            network="layernorm",
        ),
        total_steps=120,
        warmup_steps=40,
        eval_every=0,
        eval_envs=2,
        checkpoint_every=0,
        threads=1,
        residual=ResidualConfig(base=str(base or ""), demos=str(demos or ""), **residual),
    )


def test_the_residual_starts_as_the_base_exactly(tmp_path: Path, reach_base: Path, reach_demos: Path) -> None:
    trainer = ResidualTrainer(_config(tmp_path, reach_base, reach_demos))
    try:
        _, base, _ = load_bc(reach_base)
        obs = trainer.eval_env.reset(seed=3)
        raw = obs[:, : -trainer.base_dim]
        torch.testing.assert_close(obs[:, -trainer.base_dim :], base(raw).clamp(-1, 1), rtol=0, atol=0)
        action = trainer.agent.act(obs, deterministic=True)
        assert torch.equal(action, base(raw).clamp(-1, 1))
        # A whole evaluation episode: the same returns as the base alone on the same seeds.
        env = make(dataclasses.replace(REACH, num_envs=2, seed=REACH.seed + 10_000))
        try:
            alone = evaluate(lambda o: base(o).clamp(-1, 1), env, 7)
        finally:
            env.close()
        with_residual = evaluate(lambda o: trainer.agent.act(o, deterministic=True), trainer.eval_env, 7)
        torch.testing.assert_close(with_residual, alone, rtol=0, atol=0)
    finally:
        trainer.env.close()
        trainer.eval_env.close()


def test_the_residual_never_leaves_its_bound() -> None:
    agent = ResidualSAC(
        SACConfig(actor_hidden=(16,)), Sizes(6 + 3, 3, 4, torch.device("cpu")), ResidualConfig(scale=0.2), 3
    )
    with torch.no_grad():
        for p in agent.actor.parameters():
            p.normal_(0, 5.0)  # a residual driven hard into its saturation
    obs = torch.cat([torch.randn(512, 6) * 3, torch.rand(512, 3) * 1.6 - 0.8], dim=1)
    base = obs[:, 6:]
    for action in (agent.act(obs), agent.act(obs, deterministic=True)):
        gap = (action - base).abs()
        assert gap.max() <= 0.2 + 1e-6
        assert gap.max() > 0.19  # the bound is reached, not merely respected by a timid net
        assert action.abs().max() <= 1.0
    # The observation normalizer scales the observation, never the base action the residual adds to.
    agent.obs_norm.update(obs * 10 + 5)
    torch.testing.assert_close(agent.obs_norm(obs)[:, 6:], base)


def test_progressive_exploration_starts_at_the_base() -> None:
    config = ResidualConfig(scale=0.3, progressive_steps=1000)
    agent = ResidualSAC(SACConfig(actor_hidden=(16,)), Sizes(4 + 2, 2, 256, torch.device("cpu")), config, 2)
    obs = torch.cat([torch.randn(256, 4), torch.rand(256, 2) - 0.5], dim=1)
    assert torch.equal(agent.act(obs), obs[:, 4:])  # t = 0: the residual never acts
    agent.collected.fill_(500)
    on = (agent.act(obs) != obs[:, 4:]).any(dim=1).float().mean()
    assert 0.35 < on < 0.65  # t = H / 2: about half the envs explore with it
    agent.collected.fill_(2000)
    assert (agent.act(obs) != obs[:, 4:]).any(dim=1).all()


def _stream(lengths: tuple[int, ...], terminal_last: tuple[bool, ...]) -> Demos:
    frames = sum(lengths)
    obs = np.arange(frames, dtype=np.float32)[:, None].repeat(3, 1)
    terminal = np.zeros(frames, dtype=bool)
    ends = np.cumsum(lengths) - 1
    terminal[ends[list(terminal_last)]] = True
    return Demos(
        obs=obs,
        action=obs[:, :2] / 100,
        episode=np.repeat(np.arange(len(lengths)), lengths),
        fps=10.0,
        reward=np.ones(frames, dtype=np.float32),
        terminal=terminal,
    )


def test_demo_replay_keeps_episode_ends_honest() -> None:
    demos = _stream((4, 3), (False, True))  # a truncated episode, then one that terminated
    storage = demo_storage(demos, torch.device("cpu"))
    assert len(storage) == 6  # the truncated episode's last frame has no successor and is dropped
    d = storage.data
    np.testing.assert_array_equal(d["obs"][:, 0, 0].numpy(), [0, 1, 2, 4, 5, 6])
    np.testing.assert_array_equal(d["next_obs"][:, 0, 0].numpy()[:5], [1, 2, 3, 5, 6])
    np.testing.assert_array_equal(d["truncated"][:, 0].numpy(), [0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(d["terminated"][:, 0].numpy(), [0, 0, 0, 0, 0, 1])
    # A 3-step window from frame 1 stops at the truncation and bootstraps from frame 3.
    batch = storage.gather(torch.tensor([1, 3]), torch.tensor([0, 0]), 3, 0.5, 1)
    np.testing.assert_allclose(batch.reward.numpy(), [1.5, 1.75])
    np.testing.assert_allclose(batch.discount.numpy(), [0.25, 0.0])
    np.testing.assert_array_equal(batch.next_obs[:, 0].numpy(), [3, 6])
    with pytest.raises(ValueError, match="no next.reward"):
        demo_storage(dataclasses.replace(demos, reward=None), torch.device("cpu"))


def test_every_batch_is_half_demonstrations() -> None:
    online = ReplayStorage(64, 2, 3, 2, torch.device("cpu"))
    online.data["obs"].fill_(-1.0)
    online.cursor[1] = 32
    demos = demo_storage(_stream((10, 10), (True, True)), torch.device("cpu"))
    sampler = DemoMixSampler(demos, 0.5)
    for batch_size in (256, 7):
        batch = sampler.sample(online, batch_size, 1, 0.99, 1)
        from_demos = (batch.obs[:, 0] >= 0).sum()
        assert from_demos == round(batch_size * 0.5) and len(batch.obs) == batch_size
    chunked = sampler.sample(online, 64, 3, 0.99, 3)
    assert chunked.action.shape == (64, 6) and chunked.prefixes is not None and chunked.prefixes.reward.shape == (64, 3)


def test_the_target_bootstraps_from_a_random_pair_of_critics() -> None:
    config = SACConfig(actor_hidden=(16,), critic_hidden=(16,), num_critics=6, target_subset=2)
    agent = ResidualSAC(config, Sizes(5, 2, 1, torch.device("cpu")), ResidualConfig(), 0)
    with torch.no_grad():
        agent.critic_target.head.weight.zero_()
        agent.critic_target.head.bias.copy_(torch.arange(6.0).view(6, 1, 1))  # member i's target value is i
    pairs = []
    loss = agent.head.loss

    def spy(out, target_out, *args):
        pairs.append(tuple(sorted(target_out[:, 0, 0].tolist())))
        return loss(out, target_out, *args)

    agent.head.loss = spy  # pyright: ignore[reportAttributeAccessIssue]
    storage = ReplayStorage(16, 1, 5, 2, torch.device("cpu"))
    storage.cursor[1] = 16
    for _ in range(30):
        agent.td_loss(storage.gather(torch.randint(0, 16, (8,)), torch.zeros(8, dtype=torch.long), 1, 0.99, 1))
    assert all(len(set(pair)) == 2 for pair in pairs)  # two distinct members each time
    assert len(set(pairs)) >= 5  # and a fresh pair per update


def test_critic_warmup_holds_the_actor(tmp_path: Path, reach_base: Path, reach_demos: Path) -> None:
    trainer = ResidualTrainer(_config(tmp_path, reach_base, reach_demos, critic_warmup=10_000))
    before = [p.detach().clone() for p in trainer.agent.actor.parameters()]
    trainer.run()
    assert trainer.agent.updates > 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.agent.actor.parameters(), strict=True))


def test_refuses_a_base_or_demos_made_for_other_settings(tmp_path: Path, reach_base: Path, reach_demos: Path) -> None:
    config = _config(tmp_path, reach_base, reach_demos)
    dense = dataclasses.replace(config, env=dataclasses.replace(config.env, task_params={"episode_length": 40}))
    with pytest.raises(ConfigError, match=r"residual.base .*env.task_params.sparse=True, this run has None"):
        ResidualTrainer(dense)
    other = dataclasses.replace(config, env=dataclasses.replace(config.env, task="panda_push"))
    with pytest.raises(ConfigError, match="made on task 'panda_reach', this run trains on env.task='panda_push'"):
        ResidualTrainer(other)
    chunked = dataclasses.replace(
        config, agent=dataclasses.replace(config.agent, chunk=dataclasses.replace(config.agent.chunk, size=4))
    )
    with pytest.raises(ConfigError, match="sac.chunk.size: the base predicts chunks of 1"):
        ResidualTrainer(chunked)
    no_base = _config(tmp_path, None, reach_demos)
    no_base = dataclasses.replace(no_base, env=dataclasses.replace(no_base.env, task_params={"sparse": False}))
    with pytest.raises(ConfigError, match=r"residual.demos .*env.task_params.episode_length=40"):
        ResidualTrainer(no_base)


@pytest.mark.slow  # a short residual run and an export
def test_a_residual_run_trained_compiled_exports_without_a_compiler(
    tmp_path: Path, reach_base: Path, reach_demos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = ResidualTrainer(_config(tmp_path, reach_base, reach_demos))
    trainer.run()
    config_file = trainer.path / "config.yaml"
    config_file.write_text(config_file.read_text().replace("  compile: false", "  compile: true"))
    assert "compile: true" in config_file.read_text()
    monkeypatch.setattr("shutil.which", lambda _: None)  # what the gate and export meet on a robot computer
    PolicyBundle(export_residual(trainer.path))  # exports, and the bundle loads
    _, env, agent, _, _ = load_residual_run(trainer.path)
    env.close()
    assert not agent.config.compile


@pytest.mark.slow  # a short residual run and an export: about 4 s alone, over the fast tier's guard when loaded
def test_one_graph_bundle_matches_torch(tmp_path: Path, reach_base: Path, reach_demos: Path) -> None:
    trainer = ResidualTrainer(_config(tmp_path, reach_base, reach_demos))
    with torch.no_grad():
        for p in trainer.agent.actor.residual.head.parameters():
            p.normal_(0, 0.5)  # a residual that is not zero, so the parity test sees both parts
    trainer.run()
    bundle = export_residual(trainer.path)
    config, env, agent, _, base = load_residual_run(trainer.path)
    env.close()
    assert base is not None
    graph = ResidualGraph(base, agent)
    session = ort.InferenceSession(str(bundle), providers=["CPUExecutionProvider"])
    obs = np.concatenate([read_lerobot(reach_demos).obs[:64], np.random.default_rng(0).normal(size=(64, 17))]).astype(
        np.float32
    )
    commands = session.run(None, {"obs": obs})[0]
    raw = make(dataclasses.replace(config.env, num_envs=1, device="cpu"))
    with torch.no_grad():
        actions = graph(torch.from_numpy(obs)).clamp(-1, 1)
        base_actions = base(torch.from_numpy(obs)).clamp(-1, 1)
    expected = raw.action_offset + raw.action_scale * actions
    raw.close()
    np.testing.assert_allclose(commands, expected.numpy(), atol=1e-5, rtol=0)
    assert not np.allclose(actions.numpy(), base_actions.numpy(), atol=1e-3)
    assert (actions - base_actions).abs().max() <= 0.1 + 1e-6
    meta = json.loads(bundle.with_suffix(".onnx.json").read_text())
    assert meta["training"]["algo"] == "residual"
    assert meta["training"]["residual"]["scale"] == 0.1
    assert meta["training"]["residual"]["base"]["run_dir"] == str(reach_base.resolve())
    assert len(meta["training"]["residual"]["base"]["checkpoint_sha256"]) == 64
    assert meta["observation"]["dim"] == 17  # the robot feeds raw observations; the base runs inside


@pytest.mark.slow  # trains a BC base and a residual, exports and loads a bundle: over 5 s on a loaded CI machine
def test_a_chunk_base_gets_a_residual_over_its_whole_chunk(tmp_path: Path, reach_demos: Path) -> None:
    base_config = BCConfig(
        dataset=str(reach_demos),
        chunk=2,
        max_epochs=3,
        eval_episodes=1,
        log=LogConfig(root=str(tmp_path), name="bc2", tensorboard=False),
    )
    base = BCRun(base_config).run()
    config = _config(tmp_path, base, reach_demos)
    chunked = dataclasses.replace(config.agent, chunk=ChunkConfig(size=2))
    config = dataclasses.replace(config, agent=chunked, total_steps=60, warmup_steps=20)
    trainer = ResidualTrainer(config)
    assert trainer.base_dim == 14 and trainer.env.obs_dim == 17 + 14 and trainer.chunks is not None
    trainer.run()
    bundle = PolicyBundle(export_residual(trainer.path))
    assert bundle.info.chunk.size == 2
    _, env, agent, _, loaded = load_residual_run(trainer.path)
    env.close()
    assert loaded is not None
    obs = read_lerobot(reach_demos).obs[:16]
    with torch.no_grad():
        actions = ResidualGraph(loaded, agent)(torch.from_numpy(obs)).clamp(-1, 1).view(16, 2, 7)
    np.testing.assert_allclose(bundle.normalized(bundle(obs)), actions.numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow  # a short residual run
def test_a_residual_is_read_against_its_base_alone_on_the_same_episodes(
    tmp_path: Path, reach_base: Path, reach_demos: Path, capsys
) -> None:
    """The base is scored alone on the residual's own evaluation episodes before the first step; its score
    is logged for the curves, and the run's end says loudly when the residual did worse."""
    from q2real.cli.main import _against_base

    trainer = ResidualTrainer(_config(tmp_path, reach_base, reach_demos))
    trainer.run()
    _, base, _ = load_bc(reach_base)
    env = make(dataclasses.replace(REACH, num_envs=2, seed=trainer.eval_seed))
    try:
        alone = evaluate(lambda o: base(o).clamp(-1, 1), env, trainer.eval_seed)
    finally:
        env.close()
    assert trainer.base_eval == pytest.approx(float(alone.mean()), abs=1e-5)
    assert trainer.base_eval_success is not None  # sparse reach has a success test
    assert "base alone (" in capsys.readouterr().err
    records = [json.loads(line) for line in (trainer.path / "metrics.jsonl").read_text().splitlines()]
    assert [r["base_eval_return"] for r in records if "base_eval_return" in r] == [trainer.base_eval]
    assert (trainer.path / "curves.png").stat().st_size > 1000
    trainer.last_eval_success = trainer.base_eval_success - 0.5
    assert trainer.below_base() and "BELOW ITS BASE" in _against_base(trainer)
    trainer.last_eval_success = trainer.base_eval_success
    assert not trainer.below_base() and "at or above its base" in _against_base(trainer)
