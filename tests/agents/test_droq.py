"""DroQ's critics against its paper: Linear -> Dropout -> LayerNorm -> activation per hidden layer, the
dropout drawn afresh in every training pass of the online and target critics, an mlp actor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from q2real.agents.algos.droq import DroQConfig
from q2real.agents.common.actor_critic import Sizes
from q2real.agents.common.networks import EnsembleLayerNorm, EnsembleLinear
from q2real.agents.registry import LEARNERS


def test_droq_critics_drop_then_normalize_and_its_actor_is_a_plain_mlp() -> None:
    config = DroQConfig(critic_hidden=(8, 8), actor_hidden=(8, 8))
    agent = LEARNERS["droq"].learner(config, Sizes(3, 2, 1, torch.device("cpu")))
    kinds = [type(layer) for layer in agent.critic.body]
    assert kinds == [EnsembleLinear, nn.Dropout, EnsembleLayerNorm, nn.SiLU] * 2
    assert agent.critic.body[1].p == 0.01
    assert not any(isinstance(m, nn.Dropout | EnsembleLayerNorm) for m in agent.actor.modules())
    obs, action = torch.randn(64, 3), torch.rand(64, 2)
    assert agent.critic_target is not None
    for critic in (agent.critic, agent.critic_target):
        assert not torch.equal(critic(obs, action), critic(obs, action)), "fresh dropout masks per pass"
    agent.eval()
    assert torch.equal(agent.critic(obs, action), agent.critic(obs, action))


def test_dropout_outside_its_range_or_on_the_flash_trunk_is_refused() -> None:
    with pytest.raises(ValueError, match=r"droq.critic_dropout: expected in \[0, 1\)"):
        DroQConfig(critic_dropout=1.0).validate("droq")
    with pytest.raises(ValueError, match=r"droq.critic_dropout: expected 0 for the flash trunk"):
        DroQConfig(critic_network="flash", critic_hidden=(64,)).validate("droq")
