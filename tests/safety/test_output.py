"""The output stage: the shield's command as the robot's interface receives it, computed by hand."""

from __future__ import annotations

import dataclasses

import numpy as np

from q2real.hardware import robot_spec
from q2real.safety.flags import Mode, Rule
from q2real.safety.output import Output
from q2real.safety.shield import Command


def _command(flags: int = 0) -> Command:
    return Command(
        mode=Mode.RUN,
        position=np.array([0.5]),
        kp=np.array([10.0]),
        kd=np.array([2.0]),
        effort=np.array([0.3]),
        flags=Rule(flags),
    )


def test_a_torque_robot_gets_feed_forward_plus_pd_on_the_accepted_state_clipped_to_its_limit() -> None:
    spec = robot_spec("pendulum")
    assert spec.control_mode == "torque"
    limit = spec.joints[0].effort_limit
    out = Output(spec)
    assert out.interface == "effort"
    # 0.3 + 10 * (0.5 - 0.4) - 2 * 0.25 = 0.8
    np.testing.assert_allclose(out(_command(), np.array([0.4]), np.array([0.25])), [0.8])
    # Far from the target: clipped to the spec's effort limit, both ways.
    assert out(_command(), np.array([-1e3]), np.array([0.0]))[0] == limit
    assert out(_command(), np.array([1e3]), np.array([0.0]))[0] == -limit


def test_a_state_the_shield_refused_gets_no_pd_and_no_state_gets_none() -> None:
    out = Output(robot_spec("pendulum"))
    stale = _command(int(Rule.STATE_STALE))
    np.testing.assert_allclose(out(stale, np.array([0.4]), np.array([1e3])), [0.3])
    np.testing.assert_allclose(out(_command(), None, None), [0.3])


def test_a_position_robot_gets_the_shields_targets_and_a_stopped_torque_robot_zero_effort() -> None:
    torque = robot_spec("pendulum")
    position = dataclasses.replace(torque, control_mode="position")
    out = Output(position)
    assert out.interface == "position"
    np.testing.assert_array_equal(out(_command(), np.array([0.0]), np.array([9.0])), [0.5])
    np.testing.assert_array_equal(out.stopped(np.array([0.5])), [0.5])
    np.testing.assert_array_equal(Output(torque).stopped(np.array([0.7])), [0.0])
