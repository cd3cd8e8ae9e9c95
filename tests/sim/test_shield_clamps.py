"""The batched torch clamps train a policy under exactly the numpy shield's RUN-mode rules: both run side
by side on random specs (position and torque, bounded and continuous joints), measured states and
actions (beyond [-1, 1] too), tick after tick, and must send the same commands."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from q2real.hardware.action import action_mapping
from q2real.safety import Shield, ShieldConfig
from q2real.sim.shield_clamps import RULES, ShieldClamps
from tests.safety.conftest import make_spec

ENVS, TICKS = 12, 40


@pytest.mark.parametrize("mode", ["position", "torque"])
@pytest.mark.parametrize("seed", range(12))
def test_the_torch_clamps_send_the_numpy_shields_commands(mode: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    spec = make_spec(rng, int(rng.integers(1, 9)), mode)
    config = ShieldConfig(ramp_time=0.0, ramp_max_distance=math.inf, soft_limit_margin=float(rng.uniform(0, 0.2)))
    scale, offset = action_mapping(spec, None if rng.random() < 0.5 else float(rng.uniform(0.1, 1.0)))
    config = ShieldConfig(**{**config.__dict__, "action_scale": tuple(scale), "action_offset": tuple(offset)})
    names = spec.joint_names
    lo, hi = spec.array("position_limits").T
    default = spec.array("default_position")
    centre = np.where(np.isfinite(lo) & np.isfinite(hi), (np.nan_to_num(lo) + np.nan_to_num(hi)) / 2, default)
    half = np.where(np.isfinite(hi - lo), (hi - lo) / 2, 2.0)
    vmax = spec.array("velocity_limit")

    def state() -> tuple[np.ndarray, np.ndarray]:
        # Anywhere in the limits, a few just beyond them (within the shield's tolerance) and on them.
        q = centre + half * rng.uniform(-1.0, 1.0, (ENVS, len(names))) * rng.choice([1.0, 1.02], (ENVS, len(names)))
        q = np.where(rng.random(q.shape) < 0.05, np.where(rng.random(q.shape) < 0.5, lo, hi), q)
        q = np.where(np.isfinite(q), q, centre)
        return q, rng.normal(0.0, 0.5, q.shape) * vmax

    shields = [Shield(spec, config) for _ in range(ENVS)]
    q, qd = state()
    for shield, qi, qdi in zip(shields, q, qd, strict=True):
        shield.tick(names, qi, qdi, 0.0, 0.0)
        assert shield.start() and shield.run()
    clamps = ShieldClamps(
        spec, config, torch.tensor(scale).float(), torch.tensor(offset).float(), ENVS, torch.device("cpu")
    )
    clamps.previous = torch.tensor(np.stack([s._previous for s in shields])).float()
    agree = total = 0
    for tick in range(1, TICKS + 1):
        now = tick * spec.control_period
        q, qd = state()
        action = rng.normal(0.0, 0.8, q.shape) * rng.choice([1.0, 3.0], q.shape)
        expected, flags = [], []
        for shield, qi, qdi, ai in zip(shields, q, qd, action, strict=True):
            command = shield.tick(names, qi, qdi, now, now, ai, 0.0)
            assert command.mode.name == "RUN", command.reason
            expected.append(command.effort if mode == "torque" else command.position)
            flags.append([bool(command.flags & getattr(type(command.flags), rule)) for rule in RULES])
        got, acted, changed = clamps(torch.tensor(action).float(), torch.tensor(q).float(), torch.tensor(qd).float())
        np.testing.assert_allclose(
            got.numpy(), np.array(expected), rtol=1e-5, atol=1e-4 * max(1.0, np.abs(scale).max())
        )
        agree += int((acted.numpy() == np.array(flags)).sum())
        total += acted.numpy().size
        # Some joint's command changed exactly where the numpy shield says some rule acted.
        agree += int((changed.any(-1).numpy() == np.array(flags).any(-1)).sum())
        total += ENVS
    assert agree >= 0.99 * total, f"rule flags agree on {agree}/{total}"


def test_a_reset_env_starts_over_from_the_default_pose() -> None:
    spec = make_spec(np.random.default_rng(0), 3)
    scale, offset = action_mapping(spec)
    clamps = ShieldClamps(
        spec, ShieldConfig(), torch.tensor(scale).float(), torch.tensor(offset).float(), 2, torch.device("cpu")
    )
    zeros = torch.zeros(2, 3)
    clamps(torch.ones(2, 3), torch.tensor(offset).float().repeat(2, 1), zeros)
    moved = clamps.previous.clone()
    clamps.reset(torch.tensor([True, False]))
    torch.testing.assert_close(clamps.previous[0], torch.tensor(offset).float())
    torch.testing.assert_close(clamps.previous[1], moved[1])


def test_a_task_env_trains_under_the_clamps_and_reports_which_rules_acted() -> None:
    """With `shield_in_loop` the env sends what the shield would: a full-scale step on Panda is rate
    limited to velocity_limit * dt from the default pose, and the rule shows in `info`."""
    from q2real.sim import make

    plain = make(task="panda_reach", num_envs=4, backend="mujoco", device="cpu", seed=1, shield_in_loop=False)
    shielded = make(task="panda_reach", num_envs=4, backend="mujoco", device="cpu", seed=1)  # on by default
    try:
        plain.reset(seed=1)
        shielded.reset(seed=1)
        action = torch.ones(4, plain.action_dim)
        free, held = plain.step(action), shielded.step(action)
        assert "shield_rules" not in free.info
        rules = dict(zip(RULES, held.info["shield_rules"].T, strict=True))
        assert rules["RATE_LIMIT"].all() and not rules["ACTION_CLIPPED"].any()
        step = torch.tensor(shielded.spec.rate_window).float()
        target = shielded._clamps.previous - shielded.task.default_pose
        assert (target <= step + 1e-6).all() and (target > 0).any()
        moved_plain = (plain.physics.qpos[:, plain.task.qpos_index] - plain.task.default_pose).abs().max()
        moved_shielded = (shielded.physics.qpos[:, shielded.task.qpos_index] - shielded.task.default_pose).abs().max()
        assert moved_shielded < moved_plain, "the rate limit must slow the arm down"
    finally:
        plain.close()
        shielded.close()
    with pytest.raises(ValueError, match="env.shield_in_loop: needs a q2real task"):
        make(task="gymnasium:Pendulum-v1", num_envs=1, shield_in_loop=True)


def test_training_logs_the_fraction_of_each_episodes_actions_every_rule_changed() -> None:
    from q2real.agents.common.episodes import EpisodeTracker
    from q2real.sim import make

    env = make(
        task="panda_reach",
        num_envs=2,
        backend="mujoco",
        device="cpu",
        shield_in_loop=True,
        task_params={"episode_length": 10},
    )
    tracker = EpisodeTracker(2, torch.device("cpu"))
    try:
        env.reset(seed=0)
        for step in range(10):
            # A full-scale target of joint 6 (0.81 rad from home to its limit, under the task's 1 rad scale)
            # lies on the hard limit, past the soft window: half the episode.
            action = torch.ones(2, env.action_dim) * (1.0 if step < 5 else 0.0)
            tracker.update(env.step(action))
    finally:
        env.close()
    means = tracker.pop()
    assert means["episodes"] == 2 and means["shield_position_limit"] == pytest.approx(0.5)
    assert means["shield_action_clipped"] == 0.0  # the env clips to [-1, 1], as the actor's tanh does
    assert 0.0 < means["shield_rate_limit"] <= 1.0


def test_the_shield_penalty_charges_the_reward_for_how_far_the_clamps_moved_the_action() -> None:
    """reward = task reward - shield_penalty * mean over joints of |wanted - sent|, in action units."""
    from q2real.sim import make

    kwargs = dict(
        task="panda_reach", num_envs=3, backend="mujoco", device="cpu", seed=2, task_params={"joint_noise": 0.0}
    )
    free, charged = make(**kwargs), make(**kwargs, shield_penalty=0.5)
    try:
        free.reset(seed=2)
        charged.reset(seed=2)
        # Joint 0 jumps past the rate window (and env 2's joint 1 too); the other joints stay at home.
        action = torch.zeros(3, free.action_dim)
        action[:, 0] = 1.0
        action[2, 1] = -1.0
        a, b = free.step(action), charged.step(action)
        sent = (free._clamps.previous - free.action_offset) / free.action_scale
        torch.testing.assert_close(b.reward, a.reward - 0.5 * (action - sent).abs().mean(-1))
        assert (b.reward < a.reward).all()
        # Holding the clamped targets is inside every rule: no charge (a return home would be a jump).
        a, b = free.step(sent), charged.step(sent)
        torch.testing.assert_close(b.reward, a.reward)
    finally:
        free.close()
        charged.close()
    with pytest.raises(ValueError, match="env.shield_penalty: expected a finite weight"):
        make(**kwargs, shield_penalty=-1.0)
    with pytest.raises(ValueError, match="env.shield_penalty: penalizes the clamps"):
        make(**kwargs, shield_penalty=1.0, shield_in_loop=False)
