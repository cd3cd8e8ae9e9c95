"""Sum tree invariants (hypothesis), prioritized sampling frequencies and wrap-around, D-SPEAR's streams,
importance weights and the CV anchor."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from q2real.agents.common.replay import Batch, ReplayStorage
from q2real.agents.common.samplers import PrioritizedSampler, SamplerConfig, SumTree
from q2real.sim.vec_env import StepResult

CPU = torch.device("cpu")


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 300),
    fanout=st.sampled_from([2, 4, 32]),
    compiled=st.booleans(),
    updates=st.lists(
        st.lists(st.tuples(st.integers(0, 10_000), st.floats(0, 1e3, allow_nan=False)), min_size=1, max_size=40),
        min_size=1,
        max_size=8,
    ),
)
def test_every_node_is_the_sum_of_its_children_after_any_batch_updates(size, updates, fanout, compiled) -> None:
    """Both walks: compiled (the CPU's) and tensor ops (the GPU's, forced here on the CPU)."""
    tree = SumTree(size, CPU, fanout=fanout, compiled=compiled)
    expected = torch.zeros(size, dtype=torch.float64)
    for batch in updates:
        index = torch.tensor([i % size for i, _ in batch])
        value = torch.tensor([v for _, v in batch], dtype=torch.float64)
        tree.set(index, value)
        for i, v in zip(index.tolist(), value.tolist(), strict=True):
            expected[i] = v  # later duplicates win, as in the tree
    assert torch.allclose(tree.levels[0][:size], expected) and not tree.levels[0][size:].any()
    assert torch.isclose(tree.total, expected.sum())
    for below, level in zip(tree.levels, tree.levels[1:], strict=False):
        assert torch.allclose(level, below.view(-1, tree.fanout).sum(dim=1))


@settings(max_examples=20, deadline=None)
@given(
    # Priorities are (|delta| + eps)^alpha, never subnormal: with a subnormal total, u * total has too few
    # bits left to split the mass (two slots of 5e-324 drew 25 % and 75 %).
    priorities=st.lists(st.floats(0, 10, allow_nan=False, allow_subnormal=False), min_size=2, max_size=40),
    compiled=st.booleans(),
)
def test_sampling_frequencies_follow_priorities(priorities, compiled) -> None:
    p = torch.tensor(priorities, dtype=torch.float64)
    if p.sum() <= 0:
        p[0] = 1.0
    tree = SumTree(len(p), CPU, fanout=4, compiled=compiled)
    tree.set(torch.arange(len(p)), p)
    counts = torch.bincount(tree.sample(200_000, torch.Generator().manual_seed(0)), minlength=len(p)).double()
    assert counts[p == 0].sum() == 0, "a zero-priority slot was sampled"
    assert torch.allclose(counts / counts.sum(), p / p.sum(), atol=0.01)


def _storage(rows: int, envs: int) -> ReplayStorage:
    return ReplayStorage(rows * envs, envs, 1, 1, CPU)


def _add(storage: ReplayStorage, sampler: PrioritizedSampler, value: float) -> None:
    n = storage.num_envs
    result = StepResult(
        obs=torch.zeros(n, 1),
        next_obs=torch.full((n, 1), value),
        reward=torch.zeros(n),
        terminated=torch.zeros(n, dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool),
        cost=torch.zeros(n),
    )
    storage.add(torch.full((n, 1), value), torch.zeros(n, 1), result)
    sampler.on_add(storage)


def test_new_rows_get_max_priority_and_overwrite_their_slots_after_wrap_around() -> None:
    storage = _storage(rows=4, envs=3)
    sampler = PrioritizedSampler(SamplerConfig(kind="prioritized", alpha=1.0, eps=1e-9), storage)
    for t in range(4):
        _add(storage, sampler, t)
    # Rows 0-3 filled. Make row 1 dominant, then wrap around onto row 0 and row 1.
    rows, envs = torch.tensor([1, 1, 1]), torch.tensor([0, 1, 2])
    sampler.update(Batch(None, None, None, None, None, row=rows, env=envs, cost=None), torch.full((3,), 50.0))
    assert abs(sampler.max_priority - 50.0) < 1e-6
    _add(storage, sampler, 10.0)  # row 0 again
    _add(storage, sampler, 11.0)  # row 1 again: its slots must now hold the new transitions' priority
    expected = torch.tensor([50.0] * 6 + [1.0] * 6, dtype=torch.float64)  # rows 0-1 rewritten at max priority
    assert torch.allclose(sampler.priority.get(torch.arange(12)), expected)
    assert torch.isclose(sampler.priority.total, expected.sum())
    batch = sampler.sample(storage, 4096, 1, 0.99, 1)
    newest = (batch.obs.squeeze(-1) >= 10).double().mean()
    assert newest > 0.9, "new transitions (max priority) are not replayed first"


def _filled_sampler(config: SamplerConfig) -> tuple[ReplayStorage, PrioritizedSampler]:
    storage = _storage(rows=100, envs=2)
    sampler = PrioritizedSampler(config, storage)
    for t in range(100):
        _add(storage, sampler, float(t))
    # |delta| grows with the row: row r has TD error r + 1.
    rows = torch.arange(100).repeat_interleave(2)
    envs = torch.tensor([0, 1]).repeat(100)
    sampler.update(Batch(None, None, None, None, None, row=rows, env=envs, cost=None), (rows + 1).float())
    return storage, sampler


def test_actor_stream_favours_low_td_error_and_critic_stream_high() -> None:
    storage, sampler = _filled_sampler(SamplerConfig(kind="dspear", anchor=False, alpha=1.0))
    critic = sampler.sample(storage, 4096, 1, 0.99, 1).row.double().mean()
    actor = sampler.sample_actor(storage, 4096, 1, 0.99, 1).row.double().mean()
    uniform_mean = 49.5
    assert actor < 25 < uniform_mean < 60 < critic, (actor, critic)
    off = PrioritizedSampler(SamplerConfig(kind="dspear", actor_stream=False), storage)
    assert off.sample_actor(storage, 16, 1, 0.99, 1) is None


def test_importance_weights_are_normalized_and_undo_the_priority() -> None:
    storage, sampler = _filled_sampler(SamplerConfig(kind="prioritized", alpha=1.0, beta=1.0))
    batch = sampler.sample(storage, 2048, 1, 0.99, 1)
    w = batch.weight
    assert w.max() == 1.0 and (w > 0).all() and (w <= 1).all()
    # With beta = 1, weight x priority is the same for every sample (up to the batch normalization).
    product = w.double() * (batch.row + 1).double()  # priority = TD error = row + 1
    assert torch.allclose(product, product[0].expand_as(product), rtol=2e-3)  # eps = 1e-3 in the priority


def test_anchor_moves_the_prioritized_fraction_with_the_cv_of_td_errors() -> None:
    storage, sampler = _filled_sampler(SamplerConfig(kind="dspear", cv_smoothing=0.0, rho_min=0.1, rho_max=0.9))
    fractions = []
    for spread in (0.0, 0.5, 2.0, 10.0):
        td = 1.0 + spread * torch.linspace(-1, 1, 256).abs().pow(4) * 8
        batch = sampler.sample(storage, 256, 1, 0.99, 1)
        sampler.update(batch, td)
        expected_cv = float(td.std() / td.mean())
        assert abs(sampler.cv - expected_cv) < 1e-5
        assert abs(sampler.rho - min(max(expected_cv / (1 + expected_cv), 0.1), 0.9)) < 1e-6
        fractions.append(sampler.rho)
    assert fractions == sorted(fractions) and fractions[0] == 0.1 and fractions[-1] > 0.5
    ablated = PrioritizedSampler(SamplerConfig(kind="dspear", critic_stream=False), storage)
    assert ablated.rho == 0.0 and ablated.sample(storage, 64, 1, 0.99, 1).weight is None
