"""Actions as steps (`env.task_params.action_rate`): the target moves from the previous action by at
most the shield's rate window, in training, in the exported bundle and on the gate alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from q2real.agents.callbacks import deterministic_policy
from q2real.agents.config import TrainConfig
from q2real.agents.export import write_bundle
from q2real.agents.learners import build_agent
from q2real.agents.train import Trainer
from q2real.configs.loader import ConfigError, load
from q2real.contracts.schema import BundleError, validate_metadata
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.residual.bc import BCConfig, prepare
from q2real.sim import EnvConfig, RandomizationConfig, make
from q2real.sim.config import target_actions
from q2real.sim.shield_clamps import RULES

STEPS = {"observe_last_action": True, "action_rate": 0.8}


def panda(num_envs: int = 3, **params) -> EnvConfig:
    return EnvConfig(
        task="panda_push", num_envs=num_envs, device="cpu", backend="mujoco", seed=2, task_params=params or STEPS
    )


def test_a_step_is_the_rate_window_times_the_fraction_over_the_action_scale() -> None:
    env = make(panda())
    spec = env.spec
    window = spec.array("velocity_limit") * spec.control_period
    expected = 0.8 * window / env.action_scale.double().numpy()
    steps = env.action_steps
    assert steps is not None
    np.testing.assert_allclose(steps.size.double().numpy(), expected, rtol=1e-6)
    assert steps.size.max() < 0.1, "the Panda's window is a few hundredths of its action range"
    env.close()


def test_the_target_action_integrates_the_steps_from_zero_and_clips_to_the_action_range() -> None:
    env = make(panda())
    env.reset(seed=0)
    steps = env.action_steps
    assert steps is not None
    gen = torch.Generator().manual_seed(0)
    expected = torch.zeros(env.num_envs, env.action_dim)
    last = env.term_columns("last_action")
    for _ in range(60):
        # 1.7 is clipped to 1 first; pushing one joint the same way for 60 ticks reaches the range's edge.
        action = 2 * torch.rand(env.num_envs, env.action_dim, generator=gen) - 1
        action[:, 0] = 1.7
        result = env.step(action)
        expected = torch.minimum(torch.maximum(expected + steps.size * action.clamp(-1, 1), steps.low), steps.high)
        expected = torch.where(result.done[:, None], 0.0, expected)
        torch.testing.assert_close(env.task.last_action, expected, rtol=0, atol=1e-6)
        assert last is not None
        torch.testing.assert_close(result.obs[:, last], expected, rtol=0, atol=1e-6)
    assert (expected[:, 0] == steps.high[0]).all(), "the pushed joint reached the edge and stayed there"
    env.close()


@pytest.mark.parametrize("task", ["panda_push", "gr1_stand"])
def test_steps_that_drift_stop_at_the_soft_window_and_are_rate_cut_less_than_targets(task: str) -> None:
    """Random actions that drift one way: as targets, the shield cuts nearly all of them by the rate
    limit and many by the soft position limit; as steps, the position rule never fires (the steps stop
    at its window), and the rate rule only where the effort rule moved the command the tick before: the
    step is added to the policy's previous action, which then runs ahead of the command sent (GR1's legs
    under gravity: often)."""

    def cut(params: dict) -> tuple[float, float]:
        env = make(dataclasses.replace(panda(16, **params), task=task))
        env.reset(seed=0)
        gen = torch.Generator().manual_seed(1)
        rate = position = 0
        for _ in range(100):
            action = 2 * torch.rand(env.num_envs, env.action_dim, generator=gen) - 0.5
            rules = env.step(action).info["shield_rules"]
            rate += int(rules[:, RULES.index("RATE_LIMIT")].sum())
            position += int(rules[:, RULES.index("POSITION_LIMIT")].sum())
        env.close()
        return rate / (100 * 16), position / (100 * 16)

    rate, position = cut(STEPS)
    target_rate, target_position = cut({"observe_last_action": True})
    assert position == 0.0 and target_position > 0.3
    assert rate < 0.7 * target_rate and target_rate > 0.9


@pytest.mark.parametrize(
    ("task", "params", "message"),
    [
        ("panda_push", {"action_rate": 0.5}, r"action_rate: needs env.task_params.observe_last_action: true"),
        ("panda_push", {"observe_last_action": True, "action_rate": 0.0}, r"action_rate: expected a fraction"),
        ("panda_push", {"observe_last_action": True, "action_rate": 1.5}, r"in \(0, 1\], got 1.5"),
        ("pendulum_swingup", {"observe_last_action": True, "action_rate": 1.0}, r"pendulum is torque-controlled"),
    ],
)
def test_bad_action_rates_are_refused_by_key(task: str, params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make(dataclasses.replace(panda(1, **params), task=task))


def test_what_acts_on_targets_refuses_steps_and_the_gate_gives_its_env_targets(tmp_path: Path) -> None:
    config = load(
        TrainConfig,
        None,
        [
            "env.task=panda_push",
            "env.num_envs=1",
            "env.backend=mujoco",
            "env.device=cpu",
            "env.task_params.observe_last_action=true",
            "env.task_params.action_rate=1.0",
            "sac.chunk.size=4",
            f"log.root={tmp_path}",
        ],
    )
    with pytest.raises(ConfigError, match=r"action_rate: a chunk policy acts on targets, not steps"):
        Trainer(config)
    bc = dataclasses.replace(BCConfig(dataset=str(tmp_path)), env=config.env)
    with pytest.raises(ConfigError, match=r"action_rate: behaviour cloning of recorded targets"):
        prepare(bc)
    targets = target_actions(config.env)
    assert targets.task_params == {"observe_last_action": True, "action_rate": None}
    assert config.env.task_params["action_rate"] == 1.0, "the run's own config is left alone"
    plain = panda(1, observe_last_action=True)
    assert target_actions(plain) is plain


def test_the_bundle_adds_the_step_to_its_last_action_as_the_env_did_in_training(tmp_path: Path) -> None:
    """The same episodes twice: the torch policy's steps into the stepped env, and the exported bundle's
    commands (mapped back to actions) into the env the gate builds, which takes targets."""
    config = load(TrainConfig, None, ["algo=sac", "env.task=panda_push", f"log.root={tmp_path}"])
    config = dataclasses.replace(config, env=panda(4))
    stepped = make(config.env)
    torch.manual_seed(0)
    agent = build_agent(config, stepped)
    with torch.no_grad():  # a policy that moves: an untrained actor's outputs are near zero
        agent.actor.head.bias.uniform_(-3, 3)  # pyright: ignore[reportAttributeAccessIssue]
    bundle = PolicyBundle(write_bundle(config, stepped, agent, 0, tmp_path / "policy.onnx"))
    action_meta = bundle.info.metadata["action"]
    assert stepped.action_steps is not None
    np.testing.assert_allclose(action_meta["step"], stepped.action_steps.size.double().numpy(), rtol=1e-6)
    np.testing.assert_allclose(action_meta["step_range"][1], stepped.action_steps.high.double().numpy(), rtol=1e-6)
    assert "last_action + step" in action_meta["output"]
    targets = make(target_actions(config.env))
    assert targets.action_steps is None
    policy = deterministic_policy(agent, stepped)
    a, b = stepped.reset(seed=5), targets.reset(seed=5)
    moved = 0.0
    for _ in range(40):
        command = bundle(b[:, : targets.policy_obs_dim].numpy())
        ra = stepped.step(policy(a))
        rb = targets.step(torch.from_numpy(bundle.normalized(command)).float())
        a, b = ra.obs, rb.obs
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
        moved = max(moved, float(stepped.task.last_action.abs().max()))
    assert moved > 0.5, "the targets travelled across the range, a step at a time"
    stepped.close()
    targets.close()


def test_a_bundle_step_outside_its_range_is_refused() -> None:
    meta = {
        "schema_version": 1,
        "observation": {"dim": 2, "terms": [{"name": "x", "dim": 2}]},
        "action": {"dim": 2, "scale": [1.0, 1.0], "offset": [0.0, 0.0], "step": [0.1, 1e9]},
        "control_period": 0.02,
    }
    with pytest.raises(BundleError, match=r"metadata.action.step: expected numbers in \[0, 2\]"):
        validate_metadata(meta, "b.onnx")
    meta["action"]["step"] = [0.1, float("nan")]
    with pytest.raises(BundleError, match=r"metadata.action.step: expected 2 finite numbers"):
        validate_metadata(meta, "b.onnx")


def test_sensor_noise_leaves_the_previous_action_and_the_command_exact_as_the_node_knows_them() -> None:
    noisy = dataclasses.replace(panda(), randomization=RandomizationConfig(obs_noise_std=0.05, obs_bias=0.02))
    env = make(noisy)
    env.reset(seed=0)
    last, target = env.term_columns("last_action"), env.term_columns("target")
    assert last is not None and target is not None
    for _ in range(5):
        result = env.step(torch.full((env.num_envs, env.action_dim), 0.5))
        torch.testing.assert_close(result.obs[:, last], env.task.last_action, rtol=0, atol=0)
        torch.testing.assert_close(result.obs[:, target], env.task.command, rtol=0, atol=0)
    sensed = result.obs[:, : target.start] - env.task.observe(env.physics)[:, : target.start]
    assert float(sensed.abs().mean()) > 0.01, "the sensor columns still carry noise"
    env.close()


def test_sensor_noise_leaves_a_joystick_command_exact() -> None:
    config = EnvConfig(
        task="spot_joystick",
        num_envs=2,
        device="cpu",
        backend="mujoco",
        seed=1,
        randomization=RandomizationConfig(obs_noise_std=0.05),
    )
    env = make(config)
    obs = env.reset(seed=0)
    command = env.term_columns("command")
    assert command is not None
    torch.testing.assert_close(obs[:, command], env.task.command, rtol=0, atol=0)
    assert float((obs - env.task.observe(env.physics)).abs().max()) > 0.01, "the sensor columns still carry noise"
    env.close()
