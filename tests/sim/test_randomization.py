from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from q2real.hardware import robot_spec
from q2real.hardware.model import load_model
from q2real.sim import RandomizationConfig, make
from q2real.sim.randomization import sample_model_fields

DR = RandomizationConfig(
    mass_scale=(0.5, 1.5), friction_scale=(0.7, 1.3), damping_scale=(0.1, 3.0), com_offset=0.05, armature=(0.0, 0.02)
)


def test_sampling_is_seeded_per_env_and_within_range() -> None:
    model = load_model(robot_spec("cartpole"))
    a = sample_model_fields(model, DR, 64, torch.Generator().manual_seed(1))
    b = sample_model_fields(model, DR, 64, torch.Generator().manual_seed(1))
    c = sample_model_fields(model, DR, 64, torch.Generator().manual_seed(2))
    assert set(a) == {"body_mass", "body_inertia", "geom_friction", "dof_damping", "body_ipos", "dof_armature"}
    for key in a:
        assert (a[key] == b[key]).all() and not (a[key] == c[key]).all()
        assert a[key].shape == (64, *getattr(model, key).shape)
    ratio = a["body_mass"][:, 1:] / model.body_mass[None, 1:]
    assert ratio.min() >= 0.5 and ratio.max() <= 1.5 and ratio.std() > 0.1
    shift = a["body_ipos"] - model.body_ipos[None]
    assert abs(shift).max() <= 0.05 and (shift[:, 0] == 0).all() and shift[:, 1:].std() > 0.01
    added = a["dof_armature"] - model.dof_armature[None]
    assert added.min() >= 0.0 and added.max() <= 0.02


def _final_obs(task: str, randomization: RandomizationConfig, steps: int, action: float) -> torch.Tensor:
    """next_obs after `steps` constant actions from the seed-0 reset of 16 envs."""
    env = make(task=task, num_envs=16, backend="mujoco", device="cpu", randomization=randomization)
    env.reset(seed=0)
    for _ in range(steps):
        result = env.step(torch.full((16, 1), action))
    return result.next_obs


@pytest.mark.parametrize("single", [{"com_offset": 0.1}, {"armature": (0.01, 0.05)}], ids=["com_offset", "armature"])
def test_each_new_physics_effect_changes_the_dynamics(single) -> None:
    """Measured, not assumed: each effect alone moves the pendulum's trajectory away from nominal."""
    nominal = _final_obs("pendulum_swingup", RandomizationConfig(), 30, 0.7)
    randomized = _final_obs("pendulum_swingup", RandomizationConfig(**single), 30, 0.7)
    assert (randomized - nominal).abs().max() > 1e-2


def test_pd_gain_randomization_scales_stiffness_and_damping_separately() -> None:
    model = load_model(robot_spec("spot"))
    dr = RandomizationConfig(kp_scale=(0.5, 1.5), kd_scale=(2.0, 3.0))
    fields = sample_model_fields(model, dr, 32, torch.Generator().manual_seed(0))
    kp = fields["actuator_gainprm"][..., 0] / model.actuator_gainprm[None, :, 0]
    assert kp.min() >= 0.5 and kp.max() <= 1.5 and kp.std() > 0.1
    assert np.allclose(fields["actuator_biasprm"][..., 1] / model.actuator_biasprm[None, :, 1], kp)
    kd = fields["actuator_biasprm"][..., 2] / model.actuator_biasprm[None, :, 2]
    assert kd.min() >= 2.0 and kd.max() <= 3.0


@pytest.mark.parametrize("single", [{"kp_scale": (0.5, 0.6)}, {"kd_scale": (3.0, 4.0)}], ids=["kp", "kd"])
def test_pd_gain_randomization_changes_the_dynamics(single) -> None:
    def joints(dr: RandomizationConfig) -> torch.Tensor:
        env = make(task="panda_reach", num_envs=4, backend="mujoco", device="cpu", randomization=dr)
        env.reset(seed=0)
        for _ in range(10):
            result = env.step(torch.full((4, 7), 0.5))
        return result.next_obs[:, :7]

    assert (joints(RandomizationConfig(**single)) - joints(RandomizationConfig())).abs().max() > 1e-2


def test_pushes_arrive_on_schedule_and_are_seeded() -> None:
    """With a fixed interval of k ticks the first shove lands on tick k: the trajectory equals the
    unpushed one before it and leaves it from then on; the same seed repeats it exactly."""
    k = 6

    def run(dr: RandomizationConfig, seed: int = 0) -> list[torch.Tensor]:
        env = make(task="gr1_stand", num_envs=4, backend="mujoco", device="cpu", randomization=dr)
        env.reset(seed=seed)
        return [env.step(torch.zeros(4, env.action_dim)).next_obs for _ in range(k + 2)]

    pushed = RandomizationConfig(push_force=(200.0, 300.0), push_interval=(k, k))
    calm, shoved = run(RandomizationConfig()), run(pushed)
    for t in range(k - 1):
        assert torch.equal(calm[t], shoved[t])
    assert (shoved[k - 1] - calm[k - 1]).abs().max() > 0.1
    again, other = run(pushed), run(pushed, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(again, shoved, strict=True))
    assert not torch.equal(other[k], shoved[k])


def test_physics_randomization_changes_dynamics_per_env() -> None:
    nominal, randomized = (_final_obs("cartpole_swingup", dr, 50, 0.5) for dr in (RandomizationConfig(), DR))
    assert not torch.allclose(nominal, randomized, atol=1e-3)
    assert torch.equal(randomized, _final_obs("cartpole_swingup", DR, 50, 0.5))


def test_action_latency_delays_actions_by_whole_ticks() -> None:
    def trajectory(latency: int, actions: list[torch.Tensor]) -> list[torch.Tensor]:
        dr = RandomizationConfig(action_latency=(latency, latency))
        env = make(task="pendulum_swingup", num_envs=4, backend="mujoco", device="cpu", randomization=dr)
        env.reset(seed=5)
        return [env.step(a).next_obs for a in actions]

    gen = torch.Generator().manual_seed(0)
    actions = [torch.rand(4, 1, generator=gen) * 2 - 1 for _ in range(12)]
    delayed = trajectory(2, actions)
    shifted = trajectory(0, [torch.zeros(4, 1)] * 2 + actions[:-2])
    for a, b in zip(delayed, shifted, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(trajectory(0, actions)[-1], delayed[-1])


def test_observation_noise_and_bias() -> None:
    clean = make(task="pendulum_swingup", num_envs=512, backend="mujoco", device="cpu")
    noisy = make(
        task="pendulum_swingup",
        num_envs=512,
        backend="mujoco",
        device="cpu",
        randomization=RandomizationConfig(obs_noise_std=0.1),
    )
    diff = noisy.reset(seed=0) - clean.reset(seed=0)
    assert 0.09 < diff.std().item() < 0.11
    biased = make(
        task="pendulum_swingup",
        num_envs=64,
        backend="mujoco",
        device="cpu",
        randomization=RandomizationConfig(obs_bias=0.2),
    )
    clean64 = make(task="pendulum_swingup", num_envs=64, backend="mujoco", device="cpu")
    offsets = [biased.reset(seed=s) - clean64.reset(seed=s) for s in (0, 1)]
    assert torch.allclose(offsets[0], offsets[1], atol=1e-6)  # constant per env
    assert offsets[0].abs().max() <= 0.2 + 1e-6 and offsets[0][:, 0].std() > 0.05


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mass_scale": (0.0, 1.0)}, "env.randomization.mass_scale: expected 0 < low <= high"),
        ({"action_latency": (2, 1)}, "env.randomization.action_latency: expected 0 <= low <= high"),
        ({"com_offset": -0.1}, "env.randomization.com_offset: expected >= 0 m"),
        ({"armature": (0.1, 0.0)}, "env.randomization.armature: expected 0 <= low <= high"),
        ({"obs_noise_std": -1.0}, "obs_noise_std and obs_bias must be >= 0"),
        ({"kp_scale": (1.0, 0.5)}, "env.randomization.kp_scale: expected 0 < low <= high"),
        ({"push_force": (-1.0, 5.0)}, "env.randomization.push_force: expected 0 <= low <= high N"),
        ({"push_interval": (0, 5)}, "env.randomization.push_interval: expected 1 <= low <= high ticks"),
    ],
)
def test_bad_ranges_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make(task="pendulum_swingup", num_envs=2, backend="mujoco", randomization=RandomizationConfig(**changes))


def test_a_payload_loads_the_arm_past_its_gravity_compensation() -> None:
    """The arm is gravity-compensated for its own links only: holding the home pose with a 3 kg payload
    it sags under the PD gains (a few cm of steady-state error), without one it holds the pose."""
    model = load_model(robot_spec("panda"))
    wrist = model.nbody - 2  # link7; the hand's body follows it
    fields = sample_model_fields(model, RandomizationConfig(payload=(3.0, 3.0)), 2, torch.Generator(), wrist)
    assert np.allclose(fields["body_mass"][:, wrist], model.body_mass[wrist] + 3.0)
    assert np.allclose(fields["body_gravcomp"][:, wrist] * fields["body_mass"][:, wrist], model.body_mass[wrist])
    sag = {}
    for payload in (0.0, 3.0):
        env = make(
            task="panda_reach",
            num_envs=2,
            backend="mujoco",
            device="cpu",
            shield_in_loop=False,
            task_params={"joint_noise": 0.0},
            randomization=RandomizationConfig(payload=(payload, payload)),
        )
        env.reset(seed=0)
        for _ in range(50):  # within the 100-step episode
            env.step(torch.zeros(2, env.action_dim))  # action 0: the home pose
        q = env.physics.qpos[:, env.task.qpos_index]
        sag[payload] = float((q - env.task.default_pose).abs().max())
        env.close()
    assert sag[0.0] < 1e-3 and sag[3.0] > 0.01, sag


FULL = RandomizationConfig(
    mass_scale=(0.5, 1.5),
    friction_scale=(0.7, 1.3),
    damping_scale=(0.1, 3.0),
    actuator_gain_scale=(0.6, 1.1),
    kp_scale=(0.7, 1.2),
    kd_scale=(0.5, 2.0),
    com_offset=0.05,
    armature=(0.0, 0.02),
    payload=(1.0, 4.0),
)


def test_strength_moves_each_drawn_robot_toward_nominal_without_redrawing_it() -> None:
    """0 is the model's own values, 1 the full draw, 0.5 halfway to it on every linear field; the payload's
    gravity compensation still covers the link's own mass alone."""
    model = load_model(robot_spec("panda"))
    wrist = model.nbody - 2

    def fields(strength: float) -> dict[str, np.ndarray]:
        return sample_model_fields(model, FULL, 16, torch.Generator().manual_seed(3), wrist, strength)

    zero, half, full = fields(0.0), fields(0.5), fields(1.0)
    assert full.keys() == sample_model_fields(model, FULL, 16, torch.Generator().manual_seed(3), wrist).keys()
    for name, values in full.items():
        nominal = np.broadcast_to(getattr(model, name), values.shape)
        assert np.array_equal(zero[name], nominal), name
        assert not np.allclose(values, nominal), name
        if name not in ("body_gravcomp", "actuator_gainprm", "actuator_biasprm"):  # those: products of draws
            assert np.allclose(half[name], (nominal + values) / 2, rtol=1e-12, atol=1e-15), name
    kd = model.actuator_biasprm[None, :, 2]
    assert np.allclose(half["actuator_biasprm"][..., 2] - kd, (full["actuator_biasprm"][..., 2] - kd) / 2)
    unloaded = dataclasses.replace(FULL, payload=(0.0, 0.0))  # the payload is drawn last: the same links
    for strength, drawn in ((0.5, half), (1.0, full)):
        own = sample_model_fields(model, unloaded, 16, torch.Generator().manual_seed(3), wrist, strength)
        compensated = drawn["body_gravcomp"][:, wrist] * drawn["body_mass"][:, wrist]
        assert np.allclose(compensated, own["body_mass"][:, wrist])
        assert (drawn["body_mass"][:, wrist] - own["body_mass"][:, wrist]).min() >= strength * 1.0 - 1e-9


def _pendulum(dr: RandomizationConfig, strengths: tuple[float, ...] = ()) -> list[torch.Tensor]:
    env = make(task="pendulum_swingup", num_envs=8, backend="mujoco", device="cpu", randomization=dr)
    for strength in strengths:
        env.set_randomization_strength(strength)
    env.reset(seed=4)
    gen = torch.Generator().manual_seed(0)
    return [env.step(torch.rand(8, 1, generator=gen) * 2 - 1).next_obs for _ in range(25)]


def test_an_env_at_zero_strength_is_the_nominal_robot_and_back_at_one_its_own_draw() -> None:
    """Physics, latency and sensor bias all follow the strength, exactly."""
    dr = RandomizationConfig(
        mass_scale=(0.5, 1.5), damping_scale=(0.1, 3.0), armature=(0.0, 0.02), action_latency=(2, 2), obs_bias=0.2
    )
    nominal, drawn = _pendulum(RandomizationConfig()), _pendulum(dr)
    assert all(torch.equal(a, b) for a, b in zip(_pendulum(dr, (0.0,)), nominal, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(_pendulum(dr, (0.0, 0.3, 1.0)), drawn, strict=True))
    half = _pendulum(dr, (0.5,))
    assert (half[-1] - nominal[-1]).abs().max() > 1e-2 and (half[-1] - drawn[-1]).abs().max() > 1e-2


def test_latency_and_noise_follow_the_strength() -> None:
    env = make(
        task="pendulum_swingup",
        num_envs=512,
        backend="mujoco",
        device="cpu",
        randomization=RandomizationConfig(action_latency=(0, 3), obs_noise_std=0.1),
    )
    full = env._latency.clone()
    clean = make(task="pendulum_swingup", num_envs=512, backend="mujoco", device="cpu").reset(seed=0)
    for strength, latency in ((0.0, {0}), (0.5, {0, 1, 2}), (1.0, {0, 1, 2, 3})):
        env.set_randomization_strength(strength)
        assert set(env._latency.tolist()) == latency
        assert torch.equal(env._latency, torch.floor(full * strength + 0.5).long())
        assert (env.reset(seed=0) - clean).std().item() == pytest.approx(0.1 * strength, abs=0.01)
    with pytest.raises(ValueError, match="expected 0 <= strength <= 1, got 1.5"):
        env.set_randomization_strength(1.5)


def test_pushes_follow_the_strength() -> None:
    def run(dr: RandomizationConfig, strength: float) -> torch.Tensor:
        env = make(task="gr1_stand", num_envs=4, backend="mujoco", device="cpu", randomization=dr)
        env.set_randomization_strength(strength)
        env.reset(seed=0)
        for _ in range(10):
            obs = env.step(torch.zeros(4, env.action_dim)).next_obs
        return obs

    pushed = RandomizationConfig(push_force=(200.0, 300.0), push_interval=(3, 3))
    calm = run(RandomizationConfig(), 1.0)
    assert torch.equal(run(pushed, 0.0), calm)
    assert (run(pushed, 0.5) - calm).abs().max() > 0.05


def test_a_seeded_reset_starts_the_same_shoves_whatever_the_env_did_before() -> None:
    """Every point of a skill curve resets its judge with one seed: the episodes, pushes included, must not
    depend on the points judged before."""
    dr = RandomizationConfig(push_force=(200.0, 300.0), push_interval=(5, 40))

    def episode(env) -> list[torch.Tensor]:
        env.reset(seed=1)
        return [env.step(torch.zeros(4, env.action_dim)).next_obs for _ in range(45)]

    used = make(task="gr1_stand", num_envs=4, backend="mujoco", device="cpu", randomization=dr)
    used.reset(seed=0)
    for _ in range(23):
        used.step(torch.zeros(4, used.action_dim))
    fresh = make(task="gr1_stand", num_envs=4, backend="mujoco", device="cpu", randomization=dr)
    assert all(torch.equal(a, b) for a, b in zip(episode(used), episode(fresh), strict=True))
