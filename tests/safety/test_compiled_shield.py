"""The compiled shield against the reference: on random specs, settings, states, actions, clocks and
operator sequences (NaN, inf, 1e308, stamps from 1970 and 2038, clocks that jump back, messages out of
order, short or unreadable), both shields run in lockstep and must emit the same command, flags, mode
and reason on every tick, and hold the same counters."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from q2real.hardware import robot_spec
from q2real.safety import Mode, ReferenceShield, Shield, ShieldConfig
from q2real.safety.compiled import MAX_JOINTS

NASTY = [math.nan, math.inf, -math.inf, 1e308, -1e308, 1e12, -1e12, 0.0]
STAMPS = [0.0, 2.2e9, math.nan, math.inf, -math.inf, 1e308]  # 1970, 2038, and what no clock says


def _same(compiled, reference, tick: int) -> None:
    where = f"tick {tick}"
    assert compiled.mode == reference.mode, where
    assert compiled.flags == reference.flags, f"{where}: {compiled.flags!r} vs {reference.flags!r}"
    assert compiled.reason == reference.reason, where
    for field in ("position", "kp", "kd", "effort"):
        np.testing.assert_array_equal(getattr(compiled, field), getattr(reference, field), err_msg=f"{where}: {field}")


def _pair(spec, config: ShieldConfig, veto=None) -> tuple[Shield, ReferenceShield]:
    return Shield(spec, config, veto), ReferenceShield(spec, config, veto)


def _play(spec, shields: tuple[Shield, ReferenceShield], rng: np.random.Generator, ticks: int, nasty: float) -> set:
    """Drive both shields with the same inputs and operator requests; returns the modes reached."""
    compiled, reference = shields
    n = spec.num_joints
    names = list(spec.joint_names)
    lo, hi = spec.array("position_limits").T
    bounded = np.isfinite(lo) & np.isfinite(hi)
    center = np.where(bounded, (np.where(bounded, lo, 0) + np.where(bounded, hi, 0)) / 2, 0.0)
    spread = np.where(bounded, 0.2 * (np.where(bounded, hi, 1) - np.where(bounded, lo, 0)), 0.5)
    vmax = spec.array("velocity_limit")
    now, modes = 1000.0, set()
    for tick in range(ticks):
        now += spec.control_period * (1.0 if rng.random() > nasty else float(rng.choice([0.0, -3.0, 7.0, 1e6])))
        clock = now if rng.random() > nasty / 4 else float(rng.choice(STAMPS))
        q = center + spread * rng.normal(0, 1, n)
        qd = vmax * rng.normal(0, 0.5, n)
        if rng.random() < nasty:
            q[rng.integers(n)] = float(rng.choice(NASTY))
        if rng.random() < nasty:
            qd[rng.integers(n)] = float(rng.choice(NASTY)) * (1 if rng.random() < 0.5 else 1e-300)
        if rng.random() < nasty / 2:
            q = q + rng.normal(0, 4.0, n)  # beyond the limits: a fault
        stamp = clock - rng.uniform(0, 0.03)
        if rng.random() < nasty:
            stamp = float(rng.choice([*STAMPS, clock + 5.0, clock - 5.0, clock + 0.05]))
        order, message_names = np.arange(n), names
        kind = rng.random()
        if kind < nasty:
            order = rng.permutation(n)[: rng.integers(0, n + 1)]
            message_names = [names[i] for i in order]
            if rng.random() < 0.3:
                message_names = message_names + ["not_a_joint"]
                order = np.append(order, 0)
        position, velocity = q[order], qd[order]
        if rng.random() < nasty / 4:
            position = list(position)  # a plain list, as a transport might hand over
        if rng.random() < nasty / 8:
            position = ["text"] * len(order)  # unreadable
        action = rng.normal(0, 1.2, n)
        if rng.random() < nasty:
            action[rng.integers(n)] = float(rng.choice(NASTY))
        roll = rng.random()
        if roll < nasty / 2:
            action = None
        elif roll < nasty * 0.7:
            action = np.ones(n + 1)
        elif roll < nasty * 0.8:
            action = "junk"
        policy_time = float(rng.choice([0.001, 0.001, 0.001, 0.5, math.nan])) if rng.random() < nasty else 0.001
        request = rng.random()
        for shield in (compiled, reference):
            if request < 0.1:
                shield.start()
            elif request < 0.2:
                shield.run()
            elif request < 0.205:
                shield.estop("operator")
            elif request < 0.255:
                shield.reset()
            elif request < 0.26:
                shield.fall_back("input fault", Mode.DAMP)
        commands = [
            shield.tick(message_names, position, velocity, stamp, clock, action, policy_time)
            for shield in (compiled, reference)
        ]
        _same(*commands, tick)
        modes.add(commands[0].mode)
    np.testing.assert_array_equal(compiled.counters.counts, reference.counters.counts)
    assert compiled.counters.run_change == reference.counters.run_change
    return modes


def _lockstep(spec_factory, seed, joints, control, fallback, nasty, margin, clip, ramp) -> set[Mode]:
    """Both shields on one random spec, config and tick sequence; the modes they went through."""
    rng = np.random.default_rng(seed)
    spec = spec_factory(rng, joints, control)
    config = ShieldConfig(
        fallback=fallback,
        soft_limit_margin=margin,
        action_clip=clip,
        ramp_time=ramp,
        ramp_max_distance=float(rng.choice([0.5, 10.0, math.inf])),
        max_state_age=float(rng.choice([0.02, 0.1, 1.0])),
        max_deadline_misses=int(rng.integers(1, 4)),
        max_bad_actions=int(rng.integers(1, 4)),
        velocity_fault_factor=float(rng.uniform(1.0, 20.0)),
        position_tolerance=float(rng.uniform(0.0, 0.5)),
    )
    return _play(spec, _pair(spec, config), rng, 150, nasty)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32 - 1),
    joints=st.integers(1, 20),
    control=st.sampled_from(["position", "position", "torque"]),
    fallback=st.sampled_from([None, "hold", "damp"]),
    nasty=st.floats(0.0, 0.3),
    margin=st.floats(0.0, 0.45),
    clip=st.floats(0.05, 1.0),
    ramp=st.sampled_from([0.0, 0.02, 0.1]),
)
def test_the_compiled_shield_matches_the_reference_tick_for_tick(
    spec_factory, seed, joints, control, fallback, nasty, margin, clip, ramp
) -> None:
    _lockstep(spec_factory, seed, joints, control, fallback, nasty, margin, clip, ramp)


def test_the_lockstep_runs_reach_every_mode(spec_factory) -> None:
    """Guards the test above against vacuity: runs of the same kind reach every mode (and match)."""
    seen: set[Mode] = set()
    draw = np.random.default_rng(2026)
    for seed in range(60):
        control = str(draw.choice(["position", "torque"]))
        fallback = [None, "hold", "damp"][seed % 3]
        ramp = [0.0, 0.02, 0.1][seed % 3]
        seen |= _lockstep(spec_factory, seed, int(draw.integers(1, 8)), control, fallback, 0.2, 0.2, 0.5, ramp)
        if seen == set(Mode):
            break
    assert seen == set(Mode), f"modes never reached: {set(Mode) - seen}"


def test_a_veto_between_the_rules_matches_the_reference(spec_factory) -> None:
    """With a veto the kernel runs in parts and Python decides between them; it still matches."""
    rng = np.random.default_rng(7)
    spec = spec_factory(rng, 6)

    def veto(q: np.ndarray, qd: np.ndarray, action: np.ndarray) -> bool:
        return bool(action.sum() + 0.1 * q.sum() > 1.0)

    shields = _pair(spec, ShieldConfig(ramp_time=0.02, ramp_max_distance=math.inf), veto)
    _play(spec, shields, rng, 600, 0.02)
    assert shields[0].counters.rules["VETO"] > 10


def test_the_workspace_check_matches_the_reference() -> None:
    """Forward kinematics between the rate limit and the effort window, on the cartpole rail under
    position control (`bench/shield_tick.py`'s workspace row)."""
    spec = robot_spec("cartpole")
    joints = tuple(dataclasses.replace(joint, kp=200.0, kd=10.0) for joint in spec.joints)
    spec = dataclasses.replace(spec, control_mode="position", joints=joints)
    config = ShieldConfig(
        fallback="hold",
        ramp_time=0.02,
        ramp_max_distance=math.inf,
        workspace_points=("cart",),
        workspace_lower=(-0.2, -1, -1),
        workspace_upper=(0.2, 1, 1),
    )
    shields = _pair(spec, config)
    _play(spec, shields, np.random.default_rng(3), 600, 0.02)
    assert shields[0].counters.rules["WORKSPACE"] > 10


def test_a_robot_past_the_compiled_limit_is_refused_by_name(spec_factory) -> None:
    spec = spec_factory(np.random.default_rng(0), MAX_JOINTS + 1)
    with pytest.raises(ValueError, match=f"{MAX_JOINTS + 1} joints, over the compiled shield's {MAX_JOINTS}"):
        Shield(spec)


def test_the_kernels_are_ready_before_the_first_tick(spec_factory) -> None:
    """Compiling (or loading) happens when the shield is built, so the first tick in RUN does not wait."""
    spec = spec_factory(np.random.default_rng(1), 7)
    shield = Shield(spec, ShieldConfig(ramp_time=0.0, ramp_max_distance=math.inf))
    names, q = list(spec.joint_names), spec.array("default_position")
    shield.tick(names, q, np.zeros(7), 0.0, 0.0)
    assert shield.start() and shield.run()
    for kernel in (shield._k.tick, shield._k.read, shield._k.command, shield._k.finish):
        assert len(kernel.signatures) == 1, "a kernel would compile on a tick"
    shield.tick(names, q, np.zeros(7), 0.02, 0.02, np.zeros(7), 0.001)
    shield.tick(names, list(q), [0.0] * 7, 0.04, 0.04, [0.0] * 7, 0.001)
    assert all(len(k.signatures) == 1 for k in (shield._k.tick, shield._k.read, shield._k.command, shield._k.finish))
