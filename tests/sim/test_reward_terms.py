"""Every task's reward is named terms times the scales in its config, summed by `q2real.sim.reward.weigh`."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from q2real.agents.config import TrainConfig
from q2real.configs.loader import ConfigError, load
from q2real.sim import make, task_names
from q2real.sim.physics import PhysicsState
from q2real.sim.registry import make_task
from q2real.sim.reward import RewardScales, weigh


def env_of(task: str, num_envs: int = 2, **task_params):
    return make_task(task=task, num_envs=num_envs, backend="mujoco", device="cpu", task_params=task_params)


def state(env, qpos: torch.Tensor | None = None, qvel: torch.Tensor | None = None, sensordata=None) -> PhysicsState:
    """The env's state after its reset, with the given fields replaced."""
    now = env.physics
    return PhysicsState(
        now.qpos.clone() if qpos is None else qpos,
        now.qvel.clone() if qvel is None else qvel,
        now.sensordata.clone() if sensordata is None else sensordata,
    )


def values(terms: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    return {name: term.tolist() for name, term in terms.items()}


@dataclasses.dataclass
class Scales(RewardScales):
    tracking: float = 1.0
    yaw: float = 0.5
    bob: float = -2.0
    roll: float = -0.05


def test_weigh_adds_the_gains_then_takes_off_the_penalties_as_the_tasks_wrote_their_sums() -> None:
    gen = torch.Generator().manual_seed(0)
    tracking, yaw, bob, roll = (torch.rand(1000, generator=gen) for _ in range(4))
    reward, shares = weigh({"tracking": tracking, "yaw": yaw, "bob": bob, "roll": roll}, Scales())
    assert torch.equal(reward, tracking + 0.5 * yaw - (2.0 * bob + 0.05 * roll))  # bit for bit
    assert list(shares) == ["tracking", "yaw", "bob", "roll"]
    assert torch.equal(shares["bob"], -2.0 * bob) and torch.equal(shares["yaw"], 0.5 * yaw)
    torch.testing.assert_close(sum(shares.values()), reward)
    mean, parts = weigh({"tracking": tracking, "yaw": yaw}, Scales(), mean=True)
    assert torch.equal(mean, (tracking + 0.5 * yaw) / 1.5)
    torch.testing.assert_close(parts["yaw"], 0.5 * yaw / 1.5)


def test_spot_joystick_terms_on_a_hand_built_state() -> None:
    env = env_of("spot_joystick")
    task = env.task
    b = task._base_q
    qpos, qvel = state(env).qpos, torch.zeros_like(env.physics.qvel)
    # Env 0 upright, moving 0.5 m/s forward and 0.1 m/s up, rolling 0.2 and pitching -0.1 rad/s,
    # turning at the commanded 0.3 rad/s while asked for 1 m/s forward.
    qpos[:, b + 3 : b + 7] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    qvel[0, task._base_v : task._base_v + 6] = torch.tensor([0.5, 0.0, 0.1, 0.2, -0.1, 0.3])
    # Env 1 at rest, tilted 0.3 rad about x, asked to stand.
    qpos[1, b + 3 : b + 7] = torch.tensor([math.cos(0.15), math.sin(0.15), 0.0, 0.0])
    task.command = torch.tensor([[1.0, 0.0, 0.3], [0.0, 0.0, 0.0]])
    physics = state(env, qpos, qvel)
    terms = task.reward_terms(physics, torch.zeros(2, env.action_dim))
    expected = {
        "tracking_lin_vel": [math.exp(-(0.5**2) / 0.25), 1.0],
        "tracking_ang_vel": [1.0, 1.0],
        "lin_vel_z": [0.01, 0.0],
        "ang_vel_xy": [0.05, 0.0],
        "orientation": [0.0, math.sin(0.3) ** 2],
    }
    assert list(terms) == list(expected)
    for name, value in expected.items():
        assert terms[name].tolist() == pytest.approx(value, abs=1e-6), name
    reward = task.reward(physics, torch.zeros(2, env.action_dim))
    assert reward[0].item() == pytest.approx(math.exp(-1) + 0.5 - (2 * 0.01 + 0.05 * 0.05), abs=1e-6)
    assert reward[1].item() == pytest.approx(1.5 - math.sin(0.3) ** 2, abs=1e-6)
    env.close()


def test_pendulum_has_one_term_balance_upright_and_still() -> None:
    env = env_of("pendulum_swingup", num_envs=3)
    qpos = torch.tensor([[math.pi], [math.pi / 2], [math.pi]])  # 0 hangs down
    qvel = torch.tensor([[0.0], [0.0], [5.0]])  # the last at the velocity margin, where its factor is 0.55
    action = torch.tensor([[0.0], [0.0], [1.0]])  # a full action's factor: (4 + 0.1) / 5
    terms = env.task.reward_terms(state(env, qpos, qvel), action)
    assert list(terms) == ["balance"]
    assert terms["balance"].tolist() == pytest.approx([1.0, 0.5, 0.55 * 0.82], abs=1e-6)
    env.close()


def test_panda_reach_and_push_terms_on_hand_built_states() -> None:
    reach = env_of("panda_reach")
    task = reach.task
    task.command = torch.tensor([[0.5, 0.0, 0.4], [0.4, 0.1, 0.3]])
    # The end effector placed by hand where forward kinematics (tested on its own) would put it.
    placed = task.command + torch.tensor([[0.2, 0.0, 0.0], [0.0, 0.03, 0.0]])
    task._ee = lambda qpos: placed
    terms = task.reward_terms(state(reach), torch.zeros(2, reach.action_dim))
    assert values(terms) == {"reach": pytest.approx([1 - math.tanh(1.0), 1 - math.tanh(0.15)], abs=1e-6)}
    sparse = env_of("panda_reach", sparse=True)
    sparse.task.command = task.command
    sparse.task._ee = task._ee
    assert values(sparse.task.reward_terms(state(sparse), torch.zeros(2, 7))) == {"success": [0.0, 1.0]}

    push = env_of("panda_push")
    task = push.task
    task.command = torch.tensor([[0.6, 0.0], [0.5, 0.0]])
    qpos = state(push).qpos
    qpos[:, task._cube_q : task._cube_q + 3] = torch.tensor([0.5, 0.0, 0.025])
    pusher = torch.tensor([[0.5, 0.0, 0.025], [0.5, 0.0, 0.125]])  # on the cube; 10 cm above it
    task._ee = lambda qpos: pusher
    physics = state(push, qpos)
    terms = task.reward_terms(physics, torch.zeros(2, push.action_dim))
    edge = 1 - math.tanh(1.0)  # 10 cm, the distance scale
    assert values(terms) == {"reach": pytest.approx([1.0, edge], abs=1e-6), "push": pytest.approx([edge, 1.0])}
    reward = task.reward(physics, torch.zeros(2, push.action_dim))
    assert reward.tolist() == pytest.approx([(1 + 4 * edge) / 5, (edge + 4) / 5], abs=1e-6)
    for env in (reach, sparse, push):
        env.close()


@pytest.mark.parametrize("task", task_names())
def test_the_env_returns_the_sum_of_the_scaled_terms_it_reports(task: str) -> None:
    env = env_of(task, num_envs=4, episode_length=8)
    fields = {f.name for f in dataclasses.fields(env.task.config.reward_scales)}
    assert env.reward_terms and set(env.reward_terms) <= fields, "every term has a scale in the task's config"
    env.reset(seed=1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):  # across an auto-reset
        result = env.step(torch.rand(4, env.action_dim, generator=gen) * 2 - 1)
        shares = result.info["reward_terms"]
        assert shares.shape == (4, len(env.reward_terms))
        torch.testing.assert_close(shares.sum(-1), result.reward)
    env.close()


def test_the_shield_penalty_is_reported_after_the_tasks_terms() -> None:
    env = make_task(task="panda_reach", num_envs=2, backend="mujoco", device="cpu", shield_penalty=0.5)
    assert env.reward_terms == ("reach", "shield_penalty")
    env.reset(seed=0)
    result = env.step(torch.ones(2, env.action_dim))  # past the rate window: charged
    shares = result.info["reward_terms"]
    assert (shares[:, 1] < 0).all()
    torch.testing.assert_close(shares.sum(-1), result.reward)
    env.close()


def test_a_scale_from_the_command_line_changes_its_terms_share_alone() -> None:
    overrides = ["env.task=spot_joystick", "env.num_envs=4", "env.backend=mujoco", "env.device=cpu"]
    plain = make(load(TrainConfig, None, overrides).env)
    heavier = make(load(TrainConfig, None, [*overrides, "env.task_params.reward_scales.lin_vel_z=-4.0"]).env)
    assert heavier.task.config.reward_scales.lin_vel_z == -4.0  # pyright: ignore[reportAttributeAccessIssue]
    plain.reset(seed=3)
    heavier.reset(seed=3)
    action = torch.full((4, plain.action_dim), 0.5)
    a, b = plain.step(action), heavier.step(action)
    terms = list(plain.reward_terms)
    bob = terms.index("lin_vel_z")
    shares, heavier_shares = a.info["reward_terms"], b.info["reward_terms"]
    assert (shares[:, bob] < 0).all()
    torch.testing.assert_close(heavier_shares[:, bob], 2 * shares[:, bob])
    others = [i for i in range(len(terms)) if i != bob]
    assert torch.equal(heavier_shares[:, others], shares[:, others])
    torch.testing.assert_close(b.reward, a.reward + shares[:, bob])
    plain.close()
    heavier.close()


def test_push_is_a_weighted_mean_whatever_the_scales() -> None:
    env = env_of("panda_push", reward_scales={"push": 0.0})
    action = torch.zeros(2, env.action_dim)
    terms = env.task.reward_terms(env.physics, action)
    assert torch.equal(env.task.reward(env.physics, action), terms["reach"])
    env.close()
    with pytest.raises(ConfigError, match=r"reward_scales: the reward is the weighted mean of \['reach', 'push'\]"):
        env_of("panda_push", reward_scales={"push": 0.0, "reach": 0.0})


def test_an_unknown_term_or_a_non_finite_scale_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"task_params\.reward_scales\.tilt: unknown key; .*'orientation'"):
        env_of("spot_joystick", reward_scales={"tilt": -1.0})
    with pytest.raises(ConfigError, match=r"env\.task_params\.reward_scales\.forward: expected a finite number"):
        env_of("hopper_velocity", reward_scales={"forward": math.inf})


def test_each_tasks_reward_is_the_number_its_summed_expression_gave() -> None:
    """The terms' sums reproduce, bit for bit, the single expressions the tasks returned before."""
    gen = torch.Generator().manual_seed(0)
    spot = env_of("spot_joystick", num_envs=8)
    spot.reset(seed=0)
    for _ in range(5):
        spot.step(torch.rand(8, spot.action_dim, generator=gen) * 2 - 1)
    task, physics, action = spot.task, spot.physics, torch.zeros(8, spot.action_dim)
    v, w, g = task.base_linear_velocity(physics), task.base_angular_velocity(physics), task.projected_gravity(physics)
    linear = torch.exp(-((v[:, :2] - task.command[:, :2]) ** 2).sum(-1) / 0.25)
    angular = torch.exp(-((w[:, 2] - task.command[:, 2]) ** 2) / 0.25)
    penalties = 2.0 * v[:, 2] ** 2 + 0.05 * (w[:, :2] ** 2).sum(-1) + 1.0 * (g[:, :2] ** 2).sum(-1)
    assert torch.equal(task.reward(physics, action), linear + 0.5 * angular - penalties)
    spot.close()

    for name, healthy, control in (("hopper_velocity", 1.0, 1e-3), ("half_cheetah_velocity", 0.0, 0.1)):
        env = env_of(name, num_envs=8)
        env.reset(seed=0)
        action = torch.rand(8, env.action_dim, generator=gen) * 2 - 1
        env.step(action)
        task, physics = env.task, env.physics
        alive = healthy * task.healthy(physics).float()
        old = task.forward_speed(physics) + alive - control * action.pow(2).sum(-1)
        assert torch.equal(task.reward(physics, action), old), name
        env.close()


def test_gr1_joystick_terms_on_a_hand_built_state() -> None:
    """Both envs stand on the default pose, feet on the ground. Env 0 is asked to walk: its left foot
    lands after 0.5 s in the air, both feet slid 1 cm over the tick, its waist yaw is 0.05 rad past the
    soft limit and its action moved 0.5 on one joint. Env 1 is asked to stand, 1 cm above standing height
    with its waist pitched 0.1 rad: its landing pays nothing."""
    env = env_of("gr1_joystick")
    task = env.task
    b = task._base_q
    qpos, qvel = state(env).qpos, torch.zeros_like(env.physics.qvel)
    qpos[:, b : b + 7] = torch.tensor([0.0, 0.0, task.height, 1.0, 0.0, 0.0, 0.0])
    qpos[:, task.qpos_index] = task.default_pose
    qpos[0, task.qpos_index[0]] = float(task.soft_high[0]) + 0.05
    qpos[1, b + 2] += 0.01
    qpos[1, task.qpos_index[1]] += 0.1
    task.command = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    physics = state(env, qpos, qvel)
    feet = task.feet_position(physics)
    task.reset_memory(torch.ones(2, dtype=torch.bool), physics)
    task._memory["contact"] = torch.tensor([[False, True], [False, True]])
    task._memory["air_time"] = torch.tensor([[0.48, 0.0], [0.48, 0.0]])
    task._memory["feet"] = feet - torch.tensor([0.01, 0.0, 0.0])
    action = torch.zeros(2, env.action_dim)
    action[0, 3] = 0.5
    task.advance(physics, action)
    terms = task.reward_terms(physics, action)
    expected = {
        "base_height": [0.0, 1e-4],
        "feet_air_time": [0.5 - 0.4, 0.0],
        "feet_slip": [2 * 0.5**2, 2 * 0.5**2],
        "action_rate": [0.25, 0.0],
        "joint_limits": [0.05, 0.0],
        "stand_still": [0.0, 0.1],
    }
    assert list(terms)[:5] == ["tracking_lin_vel", "tracking_ang_vel", "lin_vel_z", "ang_vel_xy", "orientation"]
    for name, value in expected.items():
        assert terms[name].tolist() == pytest.approx(value, abs=1e-5), name
    assert task._memory["air_time"].tolist() == [[0.0, 0.0], [0.0, 0.0]], "on the ground, the clocks restart"
    lifted = state(env, qpos + torch.tensor([0.0, 0.0, 0.05] + [0.0] * (qpos.shape[1] - 3)), qvel)
    task.advance(lifted, action)
    assert task._memory["contact"].tolist() == [[False, False], [False, False]]
    assert task._memory["air_time"].flatten().tolist() == pytest.approx([0.02] * 4)
    env.close()
