"""The cost critic in the bundle and as the shield's veto on the node: parity with the learner, a
refused malformed section, a hold for a state the critic scores unsafe, and never a bypassed clamp."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import onnx
import pytest
import torch

from q2real.agents.algos.sac_lag import SACLag
from q2real.contracts.schema import METADATA_KEY, BundleError, seal
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.settings import NodeConfig
from q2real.safety.flags import Mode, Rule
from q2real.safety.shield import ShieldConfig
from tests.deploy_ros.conftest import export_fresh_agent

DT = 0.02
SAVED: dict[str, SACLag] = {}


def velocity_cost(agent: SACLag) -> None:
    """Q_c(s, a) = max(0, pendulum velocity): the critic scores spinning one way as unsafe."""
    SAVED["agent"] = agent
    body, head = agent.cost_critic.critic.body, agent.cost_critic.critic.head
    with torch.no_grad():
        for p in agent.cost_critic.critic.parameters():
            p.zero_()
        body[0].weight[:, 2, 0] = 1.0  # the observation's pole_velocity (after cos, sin)
        body[2].weight[:, 0, 0] = 1.0
        head.weight[:, 0, 0] = 1.0


@pytest.fixture(scope="module")
def safe_bundle(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("safe") / "pendulum_safe.onnx"
    return export_fresh_agent("pendulum_swingup", path, edit_agent=velocity_cost, algo="sac_lag")


def test_the_bundle_carries_the_cost_critic_with_parity(safe_bundle) -> None:
    bundle = PolicyBundle(safe_bundle)
    agent = SAVED["agent"]
    info = bundle.info.cost_critic
    assert info is not None and info["cost_limit"] == agent.config.cost_limit
    assert info["value_limit"] == pytest.approx(agent.value_limit)
    obs = (np.random.default_rng(0).normal(size=(64, 3)) * [1, 1, 4]).astype(np.float32)
    commands, cost = bundle.with_cost(obs)
    with torch.no_grad():
        normalized = agent.obs_norm(torch.as_tensor(obs))
        expected = agent.cost_values(normalized, agent.actor(normalized))
    assert np.abs(cost - expected.numpy()).max() < 1e-5
    assert np.array_equal(commands, bundle(obs))
    assert np.allclose(cost, np.maximum(obs[:, 2], 0), atol=1e-5)  # the edited critic, end to end


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda c: c.update(output="q"), "cost_critic.output"),
        (lambda c: c.update(value_limit=-1.0), "cost_critic.value_limit"),
        (lambda c: c.update(cost_limit=math.inf), "cost_critic.cost_limit"),
        (lambda c: c.update(gamma=1.5), "cost_critic.gamma"),
        (lambda c: c.pop("gamma"), "cost_critic.gamma"),
    ],
)
def test_a_malformed_cost_critic_section_is_refused_with_its_field_named(safe_bundle, tmp_path, edit, field) -> None:
    model = onnx.load(str(safe_bundle))
    entry = next(e for e in model.metadata_props if e.key == METADATA_KEY)
    meta = json.loads(entry.value)
    edit(meta["cost_critic"])
    entry.value = json.dumps(meta).replace("Infinity", "1e999")
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    seal(bad)
    with pytest.raises(BundleError, match=field.replace(".", r"\.")):
        PolicyBundle(bad)


def test_a_graph_whose_outputs_disagree_with_the_metadata_is_refused(safe_bundle, tmp_path) -> None:
    model = onnx.load(str(safe_bundle))
    entry = next(e for e in model.metadata_props if e.key == METADATA_KEY)
    meta = json.loads(entry.value)
    del meta["cost_critic"]  # a graph with a cost output its metadata does not explain
    entry.value = json.dumps(meta)
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    seal(bad)
    with pytest.raises(BundleError, match="outputs"):
        PolicyBundle(bad)


def test_a_cost_veto_needs_a_bundle_with_a_cost_critic(pendulum_bundle) -> None:
    with pytest.raises(BundleError, match="cost_veto"):
        PolicyNode(pendulum_bundle, NodeConfig(cost_veto=1.0))
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="cost_veto"):
            NodeConfig(cost_veto=bad).validate()


def _running(bundle, veto: float | None) -> tuple[PolicyNode, float]:
    # The veto is under test, not the policy's timing: the whole control period for the policy, so a loaded
    # machine does not turn a tick into a deadline miss (a miss holds the target, and no veto is flagged).
    config = NodeConfig(autostart=True, cost_veto=veto, shield=ShieldConfig(ramp_time=0.1, deadline=DT))
    node = PolicyNode(bundle, config)
    now = 100.0
    for _ in range(10):
        node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now)
        node.tick(now)
        now += DT
    assert node.shield.mode == Mode.RUN
    return node, now


def test_a_state_the_critic_scores_unsafe_is_held_and_a_safe_one_runs_the_policy(safe_bundle) -> None:
    node, now = _running(safe_bundle, veto=1.0)
    plain, _ = _running(safe_bundle, veto=None)
    for velocity, unsafe in ((3.0, True), (-3.0, False), (0.5, False), (1.5, True)):
        for n in (node, plain):
            n.on_joint_state(["hinge"], [0.2], [velocity], [], received=now)
        tick, free = node.tick(now), plain.tick(now)
        now += DT
        assert bool(tick.command.flags & Rule.VETO) == unsafe, velocity
        if unsafe:
            assert tick.raw_action is None or not np.array_equal(tick.values, free.values)
        else:
            assert np.array_equal(tick.values, free.values)  # a veto that does not fire changes nothing
    assert node.diagnostics()["values"]["cost_vetoes"] == "2"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_cost_value_that_is_not_a_finite_number_is_vetoed(safe_bundle, value) -> None:
    node, now = _running(safe_bundle, veto=1.0)
    bundle = node.bundle
    real = bundle.act

    def broken(obs):
        commands, cost = real(obs)
        return commands, np.full_like(cost, value)

    bundle.act = broken  # a graph whose cost output broke: the action must not run on its word
    node.on_joint_state(["hinge"], [0.2], [-3.0], [], received=now)  # a state the critic scores safe
    assert node.tick(now).command.flags & Rule.VETO


def test_the_veto_never_bypasses_a_clamp(safe_bundle) -> None:
    """Whatever the state, a vetoed tick sends what the shield sends without a policy action, and every
    command stays within the effort limit."""
    node, now = _running(safe_bundle, veto=0.0)  # everything that spins forward is vetoed
    rng = np.random.default_rng(1)
    for _ in range(200):
        node.on_joint_state(["hinge"], [rng.uniform(-3, 3)], [rng.uniform(-8, 8)], [], received=now)
        tick = node.tick(now)
        now += DT
        assert np.isfinite(tick.values).all() and abs(tick.values[0]) <= 2.0  # hardware/pendulum effort limit
    assert node.shield.counters.rules["VETO"] > 0
    low, high = node.cost_q_range  # what the console reports beside the vetoes
    assert np.isfinite([low, high]).all() and low <= 0.0 < high


@pytest.mark.slow  # the sim robot as its own DDS participant
def test_over_dds_the_critic_vetoes_unsafe_states_into_holds_and_says_so(safe_bundle, participant) -> None:
    """The pendulum swings both ways under the untrained policy; every tick it spins forward (Q_c > 0) is
    held, counted and reported on /diagnostics, and the node stays in RUN for the others."""
    from tests.deploy_ros.test_dds_loop import Listener, _config, _wait_for, running

    listener = Listener(participant("observer"))
    config = dataclasses.replace(_config(), cost_veto=0.0)
    with running(safe_bundle, config) as (node, _, _, errors):
        _wait_for(lambda: node.shield.mode == Mode.RUN or errors, 30, "RUN")
        assert not errors, errors
        _wait_for(lambda: node.shield.counters.rules["VETO"] >= 5, 10, "vetoed ticks")

        def reported() -> int:
            values = [{v.key: v.value for v in d.status[0].values} for d in listener.diagnostics]
            return max((int(v.get("cost_vetoes", 0)) for v in values), default=0)

        _wait_for(lambda: reported() > 0, 5, "cost_vetoes on /diagnostics")
        assert node.shield.mode == Mode.RUN and not errors
