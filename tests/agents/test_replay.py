"""n-step targets, episode boundaries and wrap-around on hand-checkable data."""

from __future__ import annotations

import torch

from q2real.agents.common.replay import ReplayStorage
from q2real.agents.common.samplers import UniformSampler
from q2real.sim.vec_env import StepResult

GAMMA = 0.5


def _fill(storage: ReplayStorage, rewards, terminated=(), truncated=()) -> None:
    """One env; row t has obs t, next_obs t + 100, reward rewards[t] and cost rewards[t] / 4."""
    for t, r in enumerate(rewards):
        result = StepResult(
            obs=torch.tensor([[t + 1.0]]),
            next_obs=torch.tensor([[t + 100.0]]),
            reward=torch.tensor([float(r)]),
            terminated=torch.tensor([t in terminated]),
            truncated=torch.tensor([t in truncated]),
            cost=torch.tensor([r / 4]),
        )
        storage.add(torch.tensor([[float(t)]]), torch.zeros(1, 1), result)


def _at(storage: ReplayStorage, row: int, n: int):
    return storage.gather(torch.tensor([row]), torch.tensor([0]), n, GAMMA, 1)


def test_n_step_sums_discounted_rewards_and_bootstraps_from_the_last_next_obs() -> None:
    storage = ReplayStorage(100, 1, 1, 1, torch.device("cpu"))
    _fill(storage, [1, 2, 4, 8, 16])
    batch = _at(storage, 0, 3)
    assert batch.reward.item() == 1 + 0.5 * 2 + 0.25 * 4
    assert batch.cost.item() == batch.reward.item() / 4  # the cost is summed over the same window
    assert batch.discount.item() == GAMMA**3
    assert batch.next_obs.item() == 102.0 and batch.obs.item() == 0.0


def test_termination_stops_the_sum_and_does_not_bootstrap() -> None:
    storage = ReplayStorage(100, 1, 1, 1, torch.device("cpu"))
    _fill(storage, [1, 2, 4, 8], terminated={1})
    batch = _at(storage, 0, 3)
    assert batch.reward.item() == 1 + 0.5 * 2
    assert batch.cost.item() == (1 + 0.5 * 2) / 4
    assert batch.discount.item() == 0.0
    assert batch.next_obs.item() == 101.0


def test_truncation_stops_the_sum_but_bootstraps_from_the_final_obs() -> None:
    storage = ReplayStorage(100, 1, 1, 1, torch.device("cpu"))
    _fill(storage, [1, 2, 4, 8], truncated={1})
    batch = _at(storage, 0, 3)
    assert batch.reward.item() == 1 + 0.5 * 2
    assert batch.discount.item() == GAMMA**2
    assert batch.next_obs.item() == 101.0  # the true last observation, not the next episode's first


def test_window_stops_at_the_newest_row() -> None:
    storage = ReplayStorage(100, 1, 1, 1, torch.device("cpu"))
    _fill(storage, [1, 2, 4])
    batch = _at(storage, 1, 5)
    assert batch.reward.item() == 2 + 0.5 * 4 and batch.discount.item() == GAMMA**2
    assert batch.next_obs.item() == 102.0


def test_wrap_around_keeps_windows_on_the_same_env_and_behind_the_write_head() -> None:
    storage = ReplayStorage(4, 1, 1, 1, torch.device("cpu"))
    _fill(storage, [1, 2, 4, 8, 16, 32])  # rows now hold t = 4, 5, 2, 3; pos = 2
    assert storage.pos == 2 and storage.size == 4 and len(storage) == 4
    assert storage.data["obs"][:, 0, 0].tolist() == [4.0, 5.0, 2.0, 3.0]
    batch = _at(storage, 3, 3)  # t = 3 -> t = 4 -> t = 5 across the physical end
    assert batch.reward.item() == 8 + 0.5 * 16 + 0.25 * 32
    assert batch.next_obs.item() == 105.0
    newest = _at(storage, 1, 3)  # t = 5 is the newest row: a 1-step window
    assert newest.reward.item() == 32 and newest.discount.item() == GAMMA


def test_envs_do_not_mix_and_sampler_only_reads_written_rows() -> None:
    storage = ReplayStorage(1000, 3, 1, 1, torch.device("cpu"))
    for t in range(5):
        obs = torch.tensor([[t + 0.0], [t + 10.0], [t + 20.0]])
        result = StepResult(
            obs, obs + 0.5, torch.tensor([1.0, 2.0, 3.0]), *(torch.zeros(3, dtype=torch.bool),) * 2, torch.zeros(3)
        )
        storage.add(obs, torch.zeros(3, 1), result)
    torch.manual_seed(0)
    batch = UniformSampler().sample(storage, 4096, 2, GAMMA, 1)
    assert batch.row.max() < 5
    expected = torch.tensor([1.0, 2.0, 3.0])[batch.env] * torch.where(batch.row == 4, 1.0, 1.5)
    assert torch.allclose(batch.reward, expected)
    assert torch.equal(batch.obs[:, 0] // 10, batch.env.float())
    assert set(batch.env.tolist()) == {0, 1, 2} and set(batch.row.tolist()) == {0, 1, 2, 3, 4}


def test_state_dict_round_trip() -> None:
    a = ReplayStorage(8, 1, 1, 1, torch.device("cpu"))
    _fill(a, [1, 2, 3])
    b = ReplayStorage(8, 1, 1, 1, torch.device("cpu"))
    b.load_state_dict(a.state_dict())
    assert b.pos == a.pos and b.size == a.size
    assert all(torch.equal(a.data[k], b.data[k]) for k in a.data)
