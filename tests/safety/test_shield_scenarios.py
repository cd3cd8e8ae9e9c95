"""Scenario tests: each mode transition, the ramp, the watchdog, deadline misses and veto polarity."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from q2real.hardware import JointSpec, RobotSpec, robot_spec
from q2real.hardware.action import action_from_command
from q2real.safety import Mode, Rule, Shield, ShieldConfig
from q2real.safety.flags import CLAMPS
from q2real.safety.limits import gain_scale
from q2real.safety.shield import ReferenceShield

DT = 0.01


def arm() -> RobotSpec:
    joints = tuple(
        JointSpec(f"j{i}", (-2.0, 2.0), velocity_limit=2.0, effort_limit=50.0, default_position=0.5, kp=100.0, kd=5.0)
        for i in range(2)
    )
    return RobotSpec("arm2", Path("unused.xml"), "position", DT, joints, Path("arm2.yaml"))


class Clock:
    def __init__(self, shield: Shield, q=(0.5, 0.5)):
        self.shield, self.now, self.q = shield, 0.0, np.array(q, dtype=float)

    def tick(self, action=None, names=("j0", "j1"), q=None, stamp=None, policy_time=0.001):
        self.now += DT
        q = self.q if q is None else np.asarray(q, dtype=float)
        order = [int(n[1]) for n in names]
        return self.shield.tick(
            list(names),
            q[order],
            np.zeros(len(names)),
            self.now if stamp is None else stamp,
            self.now,
            action,
            policy_time,
        )


def running(config: ShieldConfig | None = None, veto=None) -> tuple[Shield, Clock]:
    shield = Shield(arm(), config or ShieldConfig(ramp_time=0.1), veto=veto)
    clock = Clock(shield)
    clock.tick()
    assert shield.start()
    for _ in range(10):
        clock.tick()
    assert shield.run() and shield.mode == Mode.RUN
    return shield, clock


def test_passive_until_started_and_ramp_refused_when_too_far() -> None:
    shield = Shield(arm(), ShieldConfig(ramp_max_distance=0.3))
    clock = Clock(shield, q=(1.5, 0.5))
    cmd = clock.tick(action=np.ones(2))
    assert cmd.mode == Mode.PASSIVE and (cmd.kp == 0).all() and (cmd.kd == 0).all()
    assert not shield.start()
    cmd = clock.tick()
    assert cmd.mode == Mode.PASSIVE and "ramp refused" in cmd.reason
    assert shield.counters.rules["RAMP_REFUSED"] == 1
    assert not shield.run()  # no RUN without a ramp


@pytest.mark.parametrize("kind", [Shield, ReferenceShield])
@pytest.mark.parametrize(
    ("turns", "swing", "starts"), [(1, 0.3, True), (-3, -0.9, True), (2, 1.2, False), (0, 3.0, False)]
)
def test_a_hinge_that_counts_turns_starts_as_near_as_the_nearest_way_round(kind, turns, swing, starts) -> None:
    """The pendulum after a reset hangs limp, its angle a whole number of turns from the default pose:
    a torque robot's ramp only damps, so the start is judged the nearest way round."""
    shield = kind(robot_spec("pendulum"), ShieldConfig(ramp_max_distance=1.0))
    angle = 2 * math.pi * turns + swing
    shield.tick(["hinge"], np.array([angle]), np.zeros(1), 0.0, 0.0)
    assert shield.start() == starts, (turns, swing)
    command = shield.tick(["hinge"], np.array([angle]), np.zeros(1), DT, DT)
    if starts:
        assert command.mode == Mode.RAMP and command.effort is not None and not command.effort.any()
    else:
        assert command.mode == Mode.PASSIVE and "ramp refused" in command.reason


def test_a_position_robots_ramp_refuses_a_pose_as_far_as_it_would_sweep() -> None:
    """A position robot's ramp moves every turn of a joint's count: no wrapping there."""
    joint = JointSpec("wheel", (-math.inf, math.inf), 2.0, 50.0, default_position=0.0, kp=100.0, kd=5.0)
    spec = RobotSpec("wheel", Path("unused.xml"), "position", DT, (joint,), Path("wheel.yaml"))
    shield = Shield(spec, ShieldConfig(ramp_max_distance=1.0))
    shield.tick(["wheel"], np.array([2 * math.pi + 0.1]), np.zeros(1), 0.0, 0.0)
    assert not shield.start()


def test_ramp_moves_from_the_measured_pose_to_default_within_the_rate_limit() -> None:
    shield = Shield(arm(), ShieldConfig(ramp_time=0.5))
    clock = Clock(shield, q=(0.0, 1.0))
    clock.tick()
    assert shield.start()
    targets = [clock.tick().position for _ in range(60)]
    assert np.allclose(targets[0], [0.0, 1.0], atol=0.03)  # starts at the measured pose, not at default
    assert np.allclose(targets[-1], [0.5, 0.5])
    steps = np.abs(np.diff(np.array(targets), axis=0))
    assert steps.max() <= 2.0 * DT + 1e-12
    assert not Shield(arm()).run()


def test_run_maps_actions_and_clips_them() -> None:
    shield, clock = running()
    for _ in range(200):
        cmd = clock.tick(action=np.array([0.5, -3.0]))
        clock.q = cmd.position  # a robot that tracks its targets
    assert cmd.mode == Mode.RUN and cmd.flags & Rule.ACTION_CLIPPED
    assert np.allclose(cmd.position, [0.5 + 1.5 * 0.5, 0.5 - 1.5])  # default + scale * clip(a)


def test_soft_limits_sit_inside_the_hard_limits() -> None:
    shield, clock = running(ShieldConfig(ramp_time=0.1, action_scale=(3.0, 3.0)))
    for _ in range(300):
        cmd = clock.tick(action=np.array([1.0, -1.0]))
        clock.q = cmd.position
    # hard limits +-2 shrunk by 5% of the 4 rad range
    assert np.allclose(cmd.position, [1.8, -1.8]) and cmd.flags & Rule.POSITION_LIMIT


def test_joints_are_matched_by_name_not_order() -> None:
    shield, clock = running()
    for _ in range(200):
        forward = clock.tick(action=np.array([0.2, -0.2]), names=("j0", "j1"))
    swapped = clock.tick(action=np.array([0.2, -0.2]), names=("j1", "j0"))
    assert np.allclose(forward.position, swapped.position)


def test_non_finite_action_is_held_never_forwarded_and_repeats_fall_back() -> None:
    shield, clock = running(ShieldConfig(ramp_time=0.1, max_bad_actions=3))
    held = clock.tick(action=np.zeros(2)).position
    cmd = clock.tick(action=np.array([np.nan, 1.0]))
    assert cmd.flags & Rule.ACTION_NONFINITE and np.array_equal(cmd.position, held) and cmd.mode == Mode.RUN
    clock.tick(action=np.array([np.inf, 1.0]))
    cmd = clock.tick(action=np.array([np.inf, 1.0]))
    assert cmd.mode == Mode.HOLD and "unusable policy outputs" in cmd.reason
    assert np.array_equal(cmd.position, held) and (cmd.kp > 0).all()


def test_deadline_misses_hold_then_fall_back_to_damp_on_a_legged_config() -> None:
    shield, clock = running(ShieldConfig(ramp_time=0.1, fallback="damp", max_deadline_misses=2))
    clock.tick(action=np.zeros(2))
    late = clock.tick(action=np.ones(2), policy_time=0.9)  # computed, but too late: not used
    assert late.flags & Rule.DEADLINE_MISS and late.mode == Mode.RUN and not (late.position > 0.6).any()
    cmd = clock.tick(action=None)
    assert cmd.mode == Mode.DAMP and (cmd.kp == 0).all() and (cmd.kd > 0).all()
    assert "deadline misses" in cmd.reason


def test_watchdog_drops_run_when_the_state_goes_stale() -> None:
    shield, clock = running(ShieldConfig(ramp_time=0.1, max_state_age=0.05))
    held = clock.tick(action=np.zeros(2)).position
    frozen = clock.now  # the joint state stops updating: every message repeats this stamp
    modes = []
    for _ in range(10):
        cmd = clock.tick(action=np.ones(2), stamp=frozen)
        modes.append(cmd.mode)
        if cmd.flags & Rule.STATE_STALE:
            assert np.allclose(cmd.position, held) or cmd.mode == Mode.HOLD
    assert modes[:4] == [Mode.RUN] * 4  # within max_state_age the state is still fresh enough
    assert shield.mode == Mode.HOLD and Mode.HOLD in modes[4:6]
    assert shield.counters.rules["STATE_STALE"] >= 5


def test_missing_joint_is_held_and_out_of_limit_state_latches_estop() -> None:
    shield, clock = running()
    cmd = clock.tick(action=np.ones(2), names=("j0",))
    assert cmd.flags & Rule.STATE_MISSING and cmd.mode == Mode.RUN
    cmd = clock.tick(action=np.zeros(2), q=(2.5, 0.5))
    assert cmd.mode == Mode.ESTOP and cmd.flags & Rule.STATE_OUT_OF_LIMITS and "j0" in cmd.reason
    for _ in range(20):  # healthy state again: still latched
        cmd = clock.tick(action=np.zeros(2))
        assert cmd.mode == Mode.ESTOP
    assert not shield.start() and not shield.run()
    shield.reset()
    assert clock.tick().mode == Mode.PASSIVE and shield.start()


@pytest.mark.parametrize("unsafe", [True, False])
def test_veto_polarity(unsafe: bool) -> None:
    calls = []

    def veto(q, qd, action):
        calls.append(action)
        return unsafe

    shield, clock = running(veto=veto)
    before = clock.tick(action=np.zeros(2)).position
    for _ in range(100):
        cmd = clock.tick(action=np.array([1.0, 1.0]))
    assert calls and np.allclose(calls[-1], [1.0, 1.0])
    if unsafe:
        assert cmd.flags & Rule.VETO and np.array_equal(cmd.position, before), "a vetoed action got through"
    else:
        assert not cmd.flags & Rule.VETO and (cmd.position > before).all()


def test_veto_cannot_bypass_the_deterministic_limits() -> None:
    shield, clock = running(veto=lambda q, qd, a: False)
    cmd = clock.tick(action=np.array([50.0, -50.0]))
    assert np.abs(cmd.position - 0.5).max() <= 2.0 * DT + 1e-12


def test_a_reset_during_the_ramp_goes_to_passive_and_a_start_ramps_again() -> None:
    shield = Shield(arm(), ShieldConfig(ramp_time=0.5))
    clock = Clock(shield, q=(0.2, 0.2))
    clock.tick()
    assert shield.start()
    for _ in range(5):
        clock.tick()
    shield.reset()
    cmd = clock.tick()
    assert cmd.mode == Mode.PASSIVE and cmd.reason == "operator reset" and (cmd.kp == 0).all()
    assert shield.start() and clock.tick().mode == Mode.RAMP


def test_effort_feasibility_moves_the_target_toward_the_measured_pose() -> None:
    shield, clock = running()
    clock.q = np.array([0.5, 0.5])
    for _ in range(300):
        cmd = clock.tick(action=np.array([1.0, -1.0]), q=(0.5, 0.5))
    # kp (q* - q) is capped at 50 N m with kp = 100: |q* - q| <= 0.5
    assert np.allclose(np.abs(cmd.position - 0.5), 0.5) and cmd.flags & Rule.EFFORT_LIMIT


def test_torque_robot_from_a_shipped_spec() -> None:
    spec = robot_spec("cartpole")
    shield = Shield(spec, ShieldConfig(ramp_time=0.02))
    now = 0.0

    def tick(action, q=0.0):
        nonlocal now
        now += spec.control_period
        return shield.tick(["slider"], [q], [0.0], now, now, action)

    tick(None)
    assert shield.start()
    tick(None), tick(None), tick(None)
    assert shield.run()
    assert np.allclose(tick(np.array([0.5])).effort, [5.0])
    assert np.allclose(tick(np.array([9.0])).effort, [10.0])
    assert np.allclose(tick(np.array([1.0]), q=1.8).effort, [0.0])  # at the end stop, no push further out


def test_workspace_box_holds_targets_whose_forward_kinematics_leave_it(tmp_path: Path) -> None:
    import shutil

    import yaml

    from q2real.hardware import load_spec
    from q2real.hardware.spec import HARDWARE_DIR

    shutil.copy(HARDWARE_DIR / "cartpole" / "model.xml", tmp_path / "model.xml")
    data = yaml.safe_load((HARDWARE_DIR / "cartpole" / "robot.yaml").read_text())
    data["control_mode"] = "position"
    data["joints"][0].update(kp=200.0, kd=10.0, effort_limit=1000.0)
    (tmp_path / "robot.yaml").write_text(yaml.safe_dump(data))
    spec = load_spec(tmp_path / "robot.yaml")
    box = dict(workspace_points=("cart",), workspace_lower=(-0.5, -1, -1), workspace_upper=(0.5, 1, 1))
    shield = Shield(spec, ShieldConfig(ramp_time=0.05, **box))
    now, q = 0.0, 0.0

    def tick(action=None):
        nonlocal now, q
        now += spec.control_period
        cmd = shield.tick(["slider"], [q], [0.0], now, now, action)
        q = float(cmd.position[0])
        return cmd

    tick()
    assert shield.start()
    for _ in range(10):
        tick()
    assert shield.run()
    for _ in range(500):
        cmd = tick(np.array([1.0]))
    assert 0.45 < cmd.position[0] <= 0.5 and cmd.flags & Rule.WORKSPACE
    assert np.allclose(shield.workspace.positions(cmd.position)[0][0], cmd.position[0])
    with pytest.raises(ValueError, match="neither a site nor a body"):
        Shield(spec, ShieldConfig(workspace_points=("gripper",)))


def _continuous_position_spec(tmp_path: Path):
    """Cartpole's hinge as a continuous, position-controlled joint."""
    import shutil

    import yaml

    from q2real.hardware import load_spec
    from q2real.hardware.spec import HARDWARE_DIR

    shutil.copy(HARDWARE_DIR / "cartpole" / "model.xml", tmp_path / "model.xml")
    data = yaml.safe_load((HARDWARE_DIR / "cartpole" / "robot.yaml").read_text())
    data["control_mode"] = "position"
    data["joints"][0].update(position_limits=[-math.inf, math.inf], kp=200.0, kd=10.0)
    (tmp_path / "robot.yaml").write_text(yaml.safe_dump(data))
    return load_spec(tmp_path / "robot.yaml")


def test_a_continuous_joint_read_near_float_max_gets_finite_commands(tmp_path: Path) -> None:
    spec = _continuous_position_spec(tmp_path)
    shield = Shield(spec, ShieldConfig(ramp_time=0.02))
    now = 0.0
    for q, qd in [(0.0, 0.0), (0.0, 0.0), (1e308, 0.0), (-1e308, 1.0), (1e308, -1.0)]:
        now += spec.control_period
        cmd = shield.tick(["slider"], [q], [qd], now, now, None)
        if shield.mode == Mode.PASSIVE:
            assert shield.start()
        for value in (cmd.position, cmd.kp, cmd.kd, cmd.effort):
            assert np.isfinite(value).all(), cmd
    assert cmd.kp[0] == 0.0 and cmd.flags & Rule.GAIN_REDUCED
    # A velocity no joint can have is a sensor fault, not a number to compute with.
    now += spec.control_period
    cmd = shield.tick(["slider"], [1e308], [1e308], now, now, None)
    assert cmd.mode == Mode.ESTOP and "velocity limit" in cmd.reason and np.isfinite(cmd.position).all()


def test_gain_scaling_treats_an_overflowing_torque_as_over_the_limit() -> None:
    # kp (target - q) = +inf and kd qd = +inf: the torque is inf - inf = NaN, which compares false.
    scale = gain_scale(np.zeros(1), np.array([-1e308]), np.array([1e308]), np.array([200.0]), np.array([10.0]), 50.0)
    assert scale.tolist() == [0.0]


def test_a_state_stamped_ahead_of_the_clock_keeps_it_fresh_no_longer_than_max_state_age() -> None:
    spec = robot_spec("cartpole")
    shield = Shield(spec, ShieldConfig(ramp_time=0.02, max_state_age=0.1))
    now = 0.0
    shield.tick(["slider"], [0.0], [0.0], now, now)
    assert shield.start()
    for _ in range(3):
        now += spec.control_period
        shield.tick(["slider"], [0.0], [0.0], now, now)
    assert shield.run()
    shield.tick(["slider"], [0.0], [0.0], now + 0.09, now)  # stamped 90 ms in the future
    assert shield.tick(["slider"], [0.0], [0.0], now, now + 0.1 + 1e-6).mode == Mode.HOLD


@pytest.mark.parametrize(
    ("robot", "fallback"), [("spot", "damp"), ("gr1", "damp"), ("panda", "hold"), ("cartpole", "hold")]
)
def test_the_default_fallback_is_the_robots_damp_for_a_floating_base(robot: str, fallback: str) -> None:
    """A legged robot must never go stiff while it falls: unless configured, its fallback is DAMP."""
    spec = robot_spec(robot)
    assert Shield(spec).fallback == fallback
    assert Shield(spec, ShieldConfig(fallback="hold")).fallback == "hold"
    with pytest.raises(ValueError, match="fallback: expected 'hold' or 'damp'"):
        ShieldConfig(fallback="stiff").validate()  # type: ignore[arg-type]


def test_interventions_count_the_policy_ticks_on_which_a_clamp_changed_its_command() -> None:
    """One per RUN tick however many clamps acted; a fault is not a clamp, and the ramp's ticks and the
    fallback's are not the policy's."""
    shield, clock = running()
    ramp_ticks = shield.counters.ticks
    assert ramp_ticks > 0 and shield.counters.run_ticks == 0
    for _ in range(3):
        assert clock.tick(action=np.zeros(2)).flags & CLAMPS == 0  # the default pose: the previous target
    assert (shield.counters.run_ticks, shield.counters.run_interventions) == (3, 0)
    jump = clock.tick(action=np.ones(2))
    assert jump.flags & Rule.RATE_LIMIT and jump.flags & Rule.ACTION_CLIPPED == 0
    clipped = clock.tick(action=np.full(2, 5.0))
    assert clipped.flags & Rule.ACTION_CLIPPED and clipped.flags & Rule.RATE_LIMIT  # two rules, one tick
    assert (shield.counters.run_ticks, shield.counters.run_interventions) == (5, 2)
    # How far, in action units from the unclipped action: the clipped tick counts from 5, not from 1.
    sent = [action_from_command(c.position, shield.scale, shield.offset) for c in (jump, clipped)]
    expected = np.abs(sent[0] - 1.0).mean() + np.abs(sent[1] - 5.0).mean()
    assert shield.counters.run_change == pytest.approx(expected) and expected > 5.0
    held = clock.tick(action=np.full(2, math.nan))  # the previous target held for one tick: a fault
    assert held.mode == Mode.RUN and held.flags == Rule.ACTION_NONFINITE
    assert (shield.counters.run_ticks, shield.counters.run_interventions) == (6, 2)
    shield.estop()
    assert clock.tick(action=np.ones(2)).mode == Mode.ESTOP
    assert (shield.counters.run_ticks, shield.counters.run_interventions) == (6, 2)
    assert shield.counters.ticks == ramp_ticks + 7
