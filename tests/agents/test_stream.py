"""Streaming learners: ObGD's bound, stream-x's networks, Stream AC(lambda) and streaming SAC updates."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from q2real.agents.common.checkpoint import load_checkpoint
from q2real.agents.common.normalizer import ObsNormalizer
from q2real.agents.stream.networks import StreamPolicy, sparse_init, sparse_mlp
from q2real.agents.stream.obgd import ObGD
from q2real.agents.stream.stream_ac import StreamAC, StreamACConfig
from tests.agents.test_host_sync import counting_reads

finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


def _linear(weights: list[float]) -> nn.Linear:
    layer = nn.Linear(len(weights), 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([weights]))
    return layer


@settings(max_examples=200, deadline=None)
@given(
    grads=st.lists(finite, min_size=1, max_size=8),
    delta=finite,
    lr=st.floats(1e-4, 10.0),
    kappa=st.floats(1.0, 5.0),
    decay=st.floats(0.0, 1.0),
)
def test_the_step_never_exceeds_lr_or_the_overshooting_bound(grads, delta, lr, kappa, decay) -> None:
    layer = _linear([0.0] * len(grads))
    optim = ObGD(layer.parameters(), lr, gamma=1.0, lamda=decay, kappa=kappa)
    for _ in range(2):  # the second step sees a decayed trace plus a new gradient
        layer.weight.grad = torch.tensor([grads])
        optim.step(torch.tensor(delta))
    norm = optim.traces[0].abs().sum()
    step = optim.last_step
    assert step <= lr * (1 + 1e-6)
    assert step * kappa * max(abs(delta), 1.0) * norm <= 1 + 1e-4


@settings(max_examples=200, deadline=None)
@given(
    x=st.lists(st.floats(-1.0, 1.0, width=32), min_size=1, max_size=8),
    w=st.lists(st.floats(-10.0, 10.0, width=32), min_size=8, max_size=8),
    target=st.floats(-100.0, 100.0, width=32),
    lr=st.floats(1e-3, 100.0),
    kappa=st.floats(1.0, 4.0),
)
def test_a_linear_prediction_moves_toward_its_target_without_passing_it(x, w, target, lr, kappa) -> None:
    """With features in [-1, 1] the bounded step cannot carry the prediction past the target: the TD
    error keeps its sign and does not grow, however large lr is (plain SGD at lr 100 would diverge)."""
    layer = _linear(w[: len(x)])
    features = torch.tensor([x])
    optim = ObGD(layer.parameters(), lr, gamma=0.99, lamda=0.0, kappa=kappa)
    prediction = layer(features)[0, 0]
    error = target - prediction.detach()
    prediction.backward()
    optim.step(error)
    after = target - layer(features)[0, 0].detach()
    assert abs(after) <= abs(error) + 1e-3 * max(1.0, abs(error))
    assert after * error >= -1e-3 * max(1.0, abs(error)) ** 2


def test_traces_decay_by_gamma_lambda_and_clear_at_an_episode_end() -> None:
    layer = _linear([0.0, 0.0])
    optim = ObGD(layer.parameters(), lr=1e-3, gamma=0.5, lamda=0.5, kappa=1.0)
    for reset in (False, False):
        layer.weight.grad = torch.tensor([[1.0, -2.0]])
        optim.step(torch.tensor(0.0), torch.tensor(reset))
    assert torch.allclose(optim.traces[0], torch.tensor([[1.25, -2.5]]))  # 0.25 * g + g
    layer.weight.grad = torch.tensor([[1.0, -2.0]])
    optim.step(torch.tensor(0.0), torch.tensor(True))
    assert torch.count_nonzero(optim.traces[0]) == 0
    restored = ObGD(layer.parameters(), lr=1e-3, gamma=0.5, lamda=0.5, kappa=1.0)
    layer.weight.grad = torch.tensor([[1.0, 1.0]])
    optim.step(torch.tensor(0.0))
    restored.load_state_dict(optim.state_dict())
    assert torch.equal(restored.traces[0], optim.traces[0])


def test_each_ensemble_member_moves_along_its_own_error() -> None:
    weight = nn.Parameter(torch.zeros(3, 2))
    optim = ObGD([weight], lr=1e-2, gamma=0.99, lamda=0.0, kappa=1.0)
    weight.grad = torch.ones(3, 2)
    optim.step(torch.tensor([1.0, 0.0, -1.0]))
    assert (weight[0] > 0).all() and (weight[1] == 0).all() and (weight[2] < 0).all()


def test_sparse_init_zeroes_the_share_of_each_units_inputs_and_the_bias() -> None:
    layer = nn.Linear(20, 7)
    sparse_init(layer, 0.9, torch.Generator().manual_seed(0))
    assert (torch.count_nonzero(layer.weight, dim=1) == 2).all()
    assert torch.count_nonzero(layer.bias) == 0
    assert layer.weight.abs().max() <= 1 / math.sqrt(20)
    net = sparse_mlp(5, (16, 16), 1, 0.5)
    norms = [m for m in net if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 and all(not m.elementwise_affine for m in norms)


def test_the_policys_deterministic_action_is_the_clipped_mean() -> None:
    policy = StreamPolicy(3, 2, (8, 8), 0.0)
    obs = torch.randn(4, 3) * 100
    dist = policy.distribution(obs)
    assert torch.equal(policy(obs), dist.mean.clamp(-1, 1))
    assert (dist.stddev > 0).all()


def test_the_normalizer_continues_from_saved_statistics_as_one_merged_sample() -> None:
    """Statistics restored from a bundle or checkpoint and then updated one transition at a time equal
    those of all the data at once, so a handoff continues them rather than restarting."""
    gen = torch.Generator().manual_seed(0)
    first, stream = torch.randn(500, 3, generator=gen) * 2 + 1, torch.randn(300, 3, generator=gen) * 5 - 2
    saved = ObsNormalizer(3)
    saved.update(first)
    continued = ObsNormalizer(3)
    continued.load_state_dict(saved.state_dict())
    for row in stream:
        continued.update(row[None])
    merged = torch.cat([first, stream])
    assert torch.allclose(continued.mean, merged.mean(0), atol=1e-4)
    assert torch.allclose(continued.var, merged.var(0, unbiased=False), rtol=1e-3)


def _transition(agent: StreamAC, done: bool) -> tuple[torch.Tensor, ...]:
    obs = torch.randn(1, agent.obs_dim)
    action = agent.act(obs)
    return obs, action, torch.rand(1), torch.randn(1, agent.obs_dim), torch.tensor([False]), torch.tensor([done])


def test_stream_ac_updates_stay_on_the_device_and_clear_traces_at_episode_ends() -> None:
    agent = StreamAC(StreamACConfig(hidden=(16, 16)), 3, 2, torch.device("cpu"))
    before = [p.clone() for p in agent.parameters()]
    agent.learn(*_transition(agent, False))  # warm the normalizers, first-call paths
    with counting_reads() as calls:
        for _ in range(20):
            agent.learn(*_transition(agent, False))
    assert not calls, f"host reads per streaming update: {dict(calls)}"
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.parameters(), strict=True))
    assert all(torch.isfinite(v).all() for v in agent.metrics().values())
    agent.learn(*_transition(agent, True))
    assert all(torch.count_nonzero(z) == 0 for z in agent.value_optim.traces + agent.actor_optim.traces)
    assert ((agent.act(torch.randn(8, 3) * 50) - 0).abs() <= 1).all()


@pytest.mark.parametrize("key, value", [("lamda", 1.5), ("kappa_value", 0.5), ("hidden", ()), ("sparsity", 1.0)])
def test_stream_ac_settings_are_range_checked_by_key(key: str, value: object) -> None:
    config = StreamACConfig(**{key: value})  # pyright: ignore[reportArgumentType]
    failed = [name for holds, name, _ in config.checks() if not holds]
    assert failed == [key]


@pytest.mark.slow  # three CLI runs: 2.4 s quiet, 4.4 s on a slow day
def test_the_streaming_loop_trains_checkpoints_and_resumes_through_the_cli(tmp_path) -> None:
    from q2real.cli.main import main

    common = ["env.task_params.episode_length=100", "stream_ac.hidden=[16,16]", "eval_envs=2", "log.tensorboard=false"]
    args = ["train", "algo=stream_ac", "total_steps=300", "log.interval_steps=100", *common]
    assert main([*args, f"log.root={tmp_path}", "log.name=s"]) == 0
    run = tmp_path / "s"
    records = [line for line in (run / "metrics.jsonl").read_text().splitlines() if "td_error" in line]
    assert len(records) == 3
    state = load_checkpoint(run / "checkpoint.pt")
    assert state["step"] == 300 and state["traces"]["value"]["traces"]
    assert main(["train", "--resume", str(run), "total_steps=400"]) == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 400


def test_the_streaming_loop_takes_one_env_and_range_checked_settings() -> None:
    from q2real.agents.stream.train import StreamTrainConfig
    from q2real.configs.loader import ConfigError, load

    with pytest.raises(ConfigError, match="env.num_envs: a streaming learner sees one stream"):
        load(StreamTrainConfig, None, ["env.num_envs=4"])
    with pytest.raises(ConfigError, match="stream_ac.lamda"):
        load(StreamTrainConfig, None, ["stream_ac.lamda=2"])


@pytest.mark.slow
def test_stream_ac_learns_to_balance_gymnasiums_inverted_pendulum_from_one_stream(tmp_path) -> None:
    """The untrained policy lets the pole fall within a few dozen steps; within 8000 transitions, each
    learned from once, Stream AC(lambda) balances it for most of the 1000-step episode."""
    from q2real.agents.stream.train import StreamTrainConfig, StreamTrainer
    from q2real.configs.loader import load

    overrides = ["env.task=gymnasium:InvertedPendulum-v5", "total_steps=8000", "eval_every=0", "eval_envs=5"]
    config = load(StreamTrainConfig, None, [*overrides, f"log.root={tmp_path}", "log.tensorboard=false"])
    trainer = StreamTrainer(config)
    untrained = trainer.evaluate()
    trainer.run()
    assert untrained < 100, untrained
    assert trainer.last_eval is not None and trainer.last_eval > 800, trainer.last_eval
