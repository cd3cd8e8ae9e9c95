"""Native MuJoCo (float64) and MJX (float32) must give the same dynamics for the same task and actions."""

from __future__ import annotations

import pytest
import torch

from q2real.sim import RandomizationConfig, make, task_names
from q2real.sim.registry import TASKS

pytestmark = [pytest.mark.mjx, pytest.mark.timeout(600)]
STEPS = 200
# Differences come only from float32 vs float64 arithmetic; measured max over 200 steps was ~1e-4.
TOLERANCE = 2e-3


def _compare(task: str, randomization: RandomizationConfig | None = None, strength: float = 1.0) -> float:
    kwargs = dict(task=task, num_envs=16, device="cpu", task_params={"episode_length": 10_000})
    if randomization is not None:
        kwargs["randomization"] = randomization
    native, mjx = make(backend="mujoco", **kwargs), make(backend="mjx", **kwargs)
    if strength != 1.0:  # a curriculum's step: both re-install the same robots moved toward nominal
        native.set_randomization_strength(strength)
        mjx.set_randomization_strength(strength)
    # Same seeded reset; sensor terms (an end effector's position) come from each backend's own
    # forward kinematics, so they agree to float32 precision, not bit for bit.
    assert torch.allclose(native.reset(seed=3), mjx.reset(seed=3), atol=1e-5)
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for _ in range(STEPS):
        # Smooth random actions keep the comparison about dynamics, not about chaotic amplification.
        action = (torch.rand(16, native.action_dim, generator=gen) * 2 - 1) * 0.5
        a, b = native.step(action), mjx.step(action)
        worst = max(worst, (a.next_obs - b.next_obs).abs().max().item(), (a.reward - b.reward).abs().max().item())
        assert torch.equal(a.terminated, b.terminated) and torch.equal(a.truncated, b.truncated)
    return worst


# Contact-rich tasks are left out on purpose: their contacts come from different collision routines
# on the two backends (GR1's box feet differ by ~0.2 rad/s after one step even with zero actions) and
# float32 contact dynamics diverge chaotically within tens of steps (Spot; the Panda's pusher hitting
# the cube, 0.5 apart after 200 steps). The transfer gate measures that gap instead.
CONTACT_RICH = {"spot_joystick", "gr1_stand", "gr1_legs_stand", "gr1_joystick", "panda_push"}


# Native-only tasks (RK4 models MJX cannot integrate) have one backend; the sweep tests their refusal.
NATIVE_ONLY = {name for name in task_names() if TASKS[name].native_only}


@pytest.mark.parametrize("task", sorted(set(task_names()) - CONTACT_RICH - NATIVE_ONLY))
def test_backends_agree(task: str) -> None:
    assert _compare(task) < TOLERANCE


PHYSICS = RandomizationConfig(
    mass_scale=(0.5, 2.0),
    damping_scale=(0.5, 2.0),
    actuator_gain_scale=(0.8, 1.2),
    com_offset=0.02,
    armature=(0.0, 0.01),
)


@pytest.mark.parametrize("strength", [1.0, 0.4])
def test_backends_agree_under_physics_randomization(strength: float) -> None:
    assert _compare("pendulum_swingup", PHYSICS, strength) < TOLERANCE


PUSHED_TOLERANCE = 5e-2
"""Pushes of 10-20 N on an arm with up to 1 kg of payload amplify the float32 error, by how the shoves
fall: the largest difference over the 200 steps measured 2.4e-3 (joint velocity, rad/s) with one push
schedule and 2.6e-2 with the one a seeded reset draws now (a single spike at step 199, under 9e-3
before it). Pushes 10 % weaker on the native backend alone move the same episodes by 0.43."""


def test_backends_agree_under_pushes_and_pd_gain_randomization() -> None:
    dr = RandomizationConfig(
        kp_scale=(0.7, 1.3), kd_scale=(0.5, 1.5), push_force=(10.0, 20.0), push_interval=(5, 15), payload=(0.0, 1.0)
    )
    assert _compare("panda_reach", dr) < PUSHED_TOLERANCE
