"""Every learner's update on tiny networks, in milliseconds: parameters move, losses stay finite,
target networks are Polyak-averaged, and the learner's state round-trips through save/load."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch

from q2real.agents.common.actor_critic import ActorCritic, Sizes
from q2real.agents.registry import LEARNERS

OBS, ACT, ENVS, BATCH = 3, 2, 2, 16
VARIANTS = {
    **{algo: {} for algo in LEARNERS},
    "td3-fast": {"critic_head": "categorical", "target_actor": False, "exploration_noise_min": 0.01},
    "sac-huber": {"huber": True, "n_step": 3},
}


def tiny(name: str) -> ActorCritic:
    algo = name.split("-")[0]
    config = dataclasses.replace(
        LEARNERS[algo].config(), actor_hidden=(8, 8), critic_hidden=(8, 8), batch_size=BATCH, **VARIANTS[name]
    )
    return LEARNERS[algo].learner(config, Sizes(OBS, ACT, ENVS, torch.device("cpu")))


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


@pytest.fixture(params=sorted(VARIANTS))
def agent(request: pytest.FixtureRequest) -> ActorCritic:
    torch.manual_seed(0)
    return tiny(request.param)


def test_an_update_moves_critic_and_actor_with_finite_losses(agent: ActorCritic, random_batch) -> None:
    critic, actor = flat(agent.critic), flat(agent.actor)
    metrics = agent.update(random_batch(BATCH, OBS, ACT, 0, cost_rate=0.3))
    assert {"critic_loss", "actor_loss"} <= set(metrics)
    assert all(torch.isfinite(value).all() for value in metrics.values()), metrics
    assert not torch.equal(flat(agent.critic), critic)
    assert not torch.equal(flat(agent.actor), actor)
    assert agent.last_td_abs.shape == (BATCH,) and torch.isfinite(agent.last_td_abs).all()


def test_the_target_critic_is_the_polyak_average(agent: ActorCritic, random_batch) -> None:
    if not agent.config.target_network:
        assert agent.critic_target is None  # CrossQ bootstraps from the online critic
        return
    assert agent.critic_target is not None
    target_before = flat(agent.critic_target)
    agent.critic_update(random_batch(BATCH, OBS, ACT, 0, cost_rate=0.3))
    tau = agent.config.tau
    expected = (1 - tau) * target_before + tau * flat(agent.critic)
    torch.testing.assert_close(flat(agent.critic_target), expected)


def test_the_actor_steps_every_policy_delay_critic_updates(agent: ActorCritic, random_batch) -> None:
    due = []
    for i in range(6):
        agent.critic_update(random_batch(BATCH, OBS, ACT, i, cost_rate=0.3))
        due.append(agent.actor_due())
    delay = agent.config.policy_delay
    assert due == [i % delay == 0 for i in range(6)]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_save_and_load_round_trip_continues_identically(name: str, random_batch) -> None:
    agent = tiny(name)
    for i in range(3):
        agent.update(random_batch(BATCH, OBS, ACT, i, cost_rate=0.3))
    buffer = io.BytesIO()
    optimizers = {key: optim.state_dict() for key, optim in agent.optimizers().items()}
    torch.save({"agent": agent.state_dict(), "extra": agent.extra_state(), "optimizers": optimizers}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh = tiny(name)
    fresh.load_state_dict(state["agent"])
    fresh.load_extra_state(state["extra"])
    for key, optim in fresh.optimizers().items():
        optim.load_state_dict(state["optimizers"][key])
    fresh.updates = agent.updates
    for model in (agent, fresh):
        torch.manual_seed(7)
        model.update(random_batch(BATCH, OBS, ACT, 9, cost_rate=0.3))
    # Every parameter and buffer: networks, targets, normalization statistics.
    torch.testing.assert_close(fresh.state_dict(), agent.state_dict(), rtol=0, atol=0)
