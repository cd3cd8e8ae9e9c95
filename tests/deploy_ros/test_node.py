"""The node core without a transport: message validation, start-up checks, e-stop, staleness, parameters."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest

from q2real.configs.loader import ConfigError
from q2real.contracts.schema import METADATA_KEY, BundleError, seal
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.settings import NodeConfig, config_from_parameters
from q2real.safety.flags import Mode
from q2real.safety.shield import ShieldConfig
from tests.deploy_ros.conftest import export_fresh_agent

DT = 0.02


def _running_node(bundle, **shield) -> tuple[PolicyNode, float]:
    """A pendulum node in RUN after a short ramp, with the clock at the returned time."""
    node = PolicyNode(bundle, NodeConfig(autostart=True, shield=ShieldConfig(ramp_time=0.1, **shield)))
    now = 100.0
    for _ in range(10):
        node.on_joint_state(["hinge"], [0.1], [0.0], [math.nan], received=now)
        node.tick(now)
        now += DT
    assert node.shield.mode == Mode.RUN
    return node, now


def test_running_node_sends_finite_efforts_within_the_limit(pendulum_bundle) -> None:
    node, now = _running_node(pendulum_bundle)
    for _ in range(50):
        node.on_joint_state(["hinge"], [np.random.uniform(-3, 3)], [np.random.uniform(-8, 8)], [], now)
        tick = node.tick(now)
        now += DT
        assert tick.raw_action is not None and tick.observation is not None
        assert np.isfinite(tick.values).all() and abs(tick.values[0]) <= 2.0  # hardware/pendulum effort limit
    assert node.interface == "effort" and node.joints == ("hinge",)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ((["hinge"], [0.1, 0.2], [0.0], []), "lengths"),
        ((["hinge"], [0.1], [], []), "lengths"),
        ((["hinge"], [0.1], [0.0], [1.0, 2.0]), "lengths"),
        ((["hinge", "hinge"], [0.1, 0.1], [0.0, 0.0], []), "duplicate"),
        ((["hinge", "elbow"], [0.1, 0.2], [0.0, 0.0], []), "unknown"),
        (([], [], [], []), "missing"),
        ((["hinge"], [math.nan], [0.0], []), "nonfinite"),
        ((["hinge"], [0.1], [math.inf], []), "nonfinite"),
    ],
)
def test_malformed_joint_states_are_refused_and_never_used(pendulum_bundle, message, reason) -> None:
    node, now = _running_node(pendulum_bundle)
    before = node.states.latest
    refusal = node.on_joint_state(*message, received=now)
    assert refusal is not None and refusal.startswith(reason)
    assert node.states.latest is before, "a refused message replaced the joint state"
    assert node.refused[reason] == 1
    report = node.diagnostics()
    assert report["level"] >= 1 and report["values"][f"refused.{reason}"] == "1"
    assert report["values"]["last_refusal"] == refusal


def test_nan_efforts_and_declared_extra_joints_are_accepted(pendulum_bundle) -> None:
    node = PolicyNode(pendulum_bundle, NodeConfig(extra_joints=("gripper",)))
    assert node.on_joint_state(["gripper", "hinge"], [0.0, 0.3], [0.0, 0.1], [math.nan, math.nan]) is None
    assert node.states.latest.position.tolist() == [0.3]
    node.check_robot(["gripper", "hinge"])


def test_a_bundle_for_another_robot_is_refused_at_start_up(pendulum_bundle, cartpole_bundle) -> None:
    with pytest.raises(BundleError, match=r"missing \['hinge'\], unknown \['slider'\]"):
        PolicyNode(pendulum_bundle).check_robot(["slider"])
    # The cartpole policy observes the passive pole as well as the actuated cart.
    node = PolicyNode(cartpole_bundle)
    assert node.joints == ("slider", "hinge")
    with pytest.raises(BundleError, match=r"missing \['hinge'\]"):
        node.check_robot(["slider"])


def test_estop_latches_on_the_next_tick_and_only_reset_clears_it(pendulum_bundle) -> None:
    node, now = _running_node(pendulum_bundle)
    node.on_estop(True)
    tick = node.tick(now)
    assert tick.command.mode == Mode.ESTOP and "e-stop" in tick.command.reason
    node.on_estop(False)
    for _ in range(5):
        now += DT
        node.on_joint_state(["hinge"], [0.1], [0.0], [], now)
        assert node.tick(now).command.mode == Mode.ESTOP
    report = node.diagnostics()
    assert report["level"] == 2 and report["values"]["mode"] == "ESTOP"
    assert report["values"]["flags"] == "-" and int(report["values"]["ticks"]) == node.ticks
    node.on_reset()
    assert node.tick(now + DT).command.mode in (Mode.PASSIVE, Mode.RAMP)


def test_a_silent_robot_drops_the_node_to_its_fallback_within_the_state_age(pendulum_bundle) -> None:
    node, now = _running_node(pendulum_bundle, max_state_age=0.1, fallback="damp")
    last_state = now - DT
    modes = []
    while now - last_state < 0.2:
        modes.append((now - last_state, node.tick(now).command.mode))
        now += DT
    late = [age for age, mode in modes if mode == Mode.DAMP]
    assert late and late[0] <= 0.1 + DT + 1e-9, modes
    assert all(mode == Mode.DAMP for age, mode in modes if age > 0.1 + DT)


def _rewritten(bundle, tmp_path, change) -> str:
    model = onnx.load(str(bundle))
    entry = next(p for p in model.metadata_props if p.key == METADATA_KEY)
    meta = json.loads(entry.value)
    change(meta)
    entry.value = json.dumps(meta)
    path = tmp_path / "edited.onnx"
    onnx.save(model, str(path))
    seal(path)
    return str(path)


def test_bundles_the_node_cannot_run_are_refused(pendulum_bundle, tmp_path) -> None:
    no_robot = _rewritten(pendulum_bundle, tmp_path, lambda m: m.update(robot=None))
    with pytest.raises(BundleError, match="metadata.robot: missing"):
        PolicyNode(no_robot)
    no_sources = _rewritten(pendulum_bundle, tmp_path, lambda m: [t.pop("source") for t in m["observation"]["terms"]])
    with pytest.raises(BundleError, match="does not say how to build its observation"):
        PolicyNode(no_sources)


def test_ros_parameters_map_onto_the_node_config_strictly() -> None:
    bundle, config = config_from_parameters(
        {
            "policy.path": "/robot/policy.onnx",
            "use_sim_time": False,
            "command_style": "trajectory",
            "extra_joints": ["gripper"],
            "topics.joint_states": "/arm/joint_states",
            "shield.fallback": "damp",
            "shield.ramp_time": 1.5,
        }
    )
    assert bundle == "/robot/policy.onnx"
    assert config.command_style == "trajectory" and config.extra_joints == ("gripper",)
    assert config.topics.joint_states == "/arm/joint_states"
    assert config.shield.fallback == "damp" and config.shield.ramp_time == 1.5
    assert config.command_topic() == "/joint_trajectory_controller/joint_trajectory"
    with pytest.raises(ConfigError, match="shield.ramp_tme"):
        config_from_parameters({"policy.path": "p.onnx", "shield.ramp_tme": 1.0})
    with pytest.raises(ValueError, match="policy.path"):
        config_from_parameters({"command_style": "forward"})


def test_a_new_run_does_not_observe_the_last_runs_action(tmp_path) -> None:
    """At every handover the previous target is the default pose, an action of zeros (as in training):
    after an e-stop and a restart the policy's first observation does not carry the last run's output."""
    bundle = export_fresh_agent("panda_reach", tmp_path / "panda.onnx", {"observe_last_action": True})
    node = PolicyNode(bundle, NodeConfig(autostart=True, shield=ShieldConfig(ramp_time=0.1)))
    terms = node.bundle.info.metadata["observation"]["terms"]
    start = sum(t["dim"] for t in terms[: [t["name"] for t in terms].index("last_action")])
    last = slice(start, start + node.bundle.info.action_dim)
    pose = [float(v) for v in node.spec.array("default_position")]
    assert node.on_task_command([0.5, 0.0, 0.4]) is None
    now = 100.0

    def first_run_observation() -> np.ndarray:
        nonlocal now
        for _ in range(20):
            node.on_joint_state(list(node.joints), pose, [0.0] * len(pose), [], received=now)
            tick = node.tick(now)
            now += DT
            if tick.observation is not None:
                return tick.observation.reshape(-1)
        raise AssertionError(f"no RUN tick (mode {node.shield.mode.name})")

    assert np.all(first_run_observation()[last] == 0.0)
    second = first_run_observation()  # the next tick sees the policy's first output
    assert np.any(second[last] != 0.0) and np.all(np.abs(second[last]) <= 1.0)
    node.on_estop(True)
    node.tick(now)
    node.on_reset()
    node.tick(now)
    assert node.shield.mode == Mode.PASSIVE
    node.start()  # the operator's: an e-stop ends autostart
    assert np.all(first_run_observation()[last] == 0.0)


def test_the_action_history_is_the_nodes_own_outputs_before_the_last_newest_first(tmp_path) -> None:
    """Two ticks of history beside the last action: each RUN tick's observation holds the outputs of the
    three ticks before it, in order, zeros where the run had none, and a new run starts from zeros."""
    params = {"observe_last_action": True, "action_history": 2}
    bundle = export_fresh_agent("panda_reach", tmp_path / "panda.onnx", params)
    node = PolicyNode(bundle, NodeConfig(autostart=True, shield=ShieldConfig(ramp_time=0.1)))
    terms = node.bundle.info.metadata["observation"]["terms"]
    assert [t["source"] for t in terms[-2:]] == [{"kind": "last_action"}, {"kind": "action_history"}]
    dim = node.bundle.info.action_dim
    start = sum(t["dim"] for t in terms[:-2])
    pose = [float(v) for v in node.spec.array("default_position")]
    assert node.on_task_command([0.5, 0.0, 0.4]) is None
    now = 100.0

    def run_observations(ticks: int) -> list[np.ndarray]:
        nonlocal now
        seen: list[np.ndarray] = []
        for _ in range(40):
            node.on_joint_state(list(node.joints), pose, [0.0] * len(pose), [], received=now)
            tick = node.tick(now)
            now += DT
            if tick.observation is not None:
                seen.append(tick.observation.reshape(-1)[start:].copy())
                if len(seen) == ticks:
                    return seen
        raise AssertionError(f"no RUN tick (mode {node.shield.mode.name})")

    seen = run_observations(5)
    outputs = [o[:dim] for o in seen[1:]]  # the last action each tick saw: the outputs so far
    assert np.all(seen[0] == 0.0) and all(np.any(o != 0.0) for o in outputs)
    for k in range(1, 5):
        expected = [outputs[k - 2] if k >= 2 else np.zeros(dim), outputs[k - 3] if k >= 3 else np.zeros(dim)]
        np.testing.assert_array_equal(seen[k][dim:], np.concatenate(expected), err_msg=f"RUN tick {k}")
    node.on_estop(True)
    node.tick(now)
    node.on_reset()
    node.tick(now)
    node.start()
    assert np.all(run_observations(1)[0] == 0.0), "a new run remembers nothing of the last"


def test_a_policy_that_reads_a_command_never_runs_on_a_made_up_one(tmp_path) -> None:
    """A reach bundle without a target yet ramps to the default pose and holds there, saying why on
    /diagnostics; the first command hands over."""
    bundle = export_fresh_agent("panda_reach", tmp_path / "panda.onnx")
    node = PolicyNode(bundle, NodeConfig(autostart=True, require_subscriber=False, shield=ShieldConfig(ramp_time=0.1)))
    pose = [float(v) for v in node.spec.array("default_position")]
    now = 100.0
    modes = []
    for _ in range(30):
        node.on_joint_state(list(node.joints), pose, [0.0] * len(pose), [], received=now)
        modes.append(node.tick(now).command.mode)
        now += DT
    assert Mode.RAMP in modes and Mode.RUN not in modes
    waiting = node.diagnostics()["values"]["waiting_for_inputs"]
    assert "no command on /q2real_policy/command yet" in waiting and "3 values" in waiting
    assert node.on_task_command([0.5, 0.0, 0.4]) is None
    node.on_joint_state(list(node.joints), pose, [0.0] * len(pose), [], received=now)
    assert node.tick(now).command.mode == Mode.RUN


@pytest.mark.parametrize("stamp", [1.0, 2**31 + 10.0, -5.0])
def test_a_joint_state_stamped_far_from_this_clock_is_refused(pendulum_bundle, stamp: float) -> None:
    """1970, 2038 or a negative stamp: with `max_stamp_skew` set, the robot's clock is not this
    machine's, so the message cannot be trusted to be fresh however recently it arrived. Off (the
    default, for robots whose clock is not synchronized), the same message is taken."""
    assert PolicyNode(pendulum_bundle).on_joint_state(["hinge"], [0.1], [0.0], [], stamp=stamp) is None
    config = NodeConfig()
    config.inputs.max_stamp_skew = 1.0
    node = PolicyNode(pendulum_bundle, config)
    reason = node.on_joint_state(["hinge"], [0.1], [0.0], [], stamp=stamp)
    assert reason is not None and reason.startswith("stamp: ") and "synchronized" in reason
    assert node.states.latest is None and node.refused["stamp"] == 1


def test_current_stamps_are_taken(pendulum_bundle) -> None:
    import time as wall

    config = NodeConfig()
    config.inputs.max_stamp_skew = 1.0
    node = PolicyNode(pendulum_bundle, config)
    assert node.on_joint_state(["hinge"], [0.2], [0.0], [], stamp=wall.time() - 0.2) is None
    assert node.states.latest is not None and node.states.latest.position.tolist() == [0.2]


def test_an_unset_stamp_is_refused_when_stamps_are_checked(pendulum_bundle) -> None:
    """A zero stamp (1970-01-01, a driver that sets none) cannot be compared with this clock: with
    `max_stamp_skew` set it is refused, saying the robot must stamp; off, it is taken on arrival."""
    assert PolicyNode(pendulum_bundle).on_joint_state(["hinge"], [0.1], [0.0], [], stamp=0.0) is None
    config = NodeConfig()
    config.inputs.max_stamp_skew = 1.0
    node = PolicyNode(pendulum_bundle, config)
    reason = node.on_joint_state(["hinge"], [0.1], [0.0], [], stamp=0.0)
    assert reason is not None and "must stamp its joint states" in reason and "max_stamp_skew" in reason
    assert node.states.latest is None and node.refused["stamp"] == 1
    assert node.diagnostics()["values"]["last_refusal"] == reason


def _passive_node(bundle) -> tuple[PolicyNode, float]:
    """A pendulum node waiting for the operator's start, with a joint state read."""
    node = PolicyNode(bundle, NodeConfig(shield=ShieldConfig(ramp_time=0.1)))
    now = 100.0
    node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now)
    node.tick(now)
    return node, now + DT


def _tick(node: PolicyNode, now: float, *requests: str) -> Mode:
    for request in requests:
        {"start": node.start, "reset": node.on_reset, "estop": lambda: node.on_estop(True)}[request]()
    node.on_joint_state(["hinge"], [0.1], [0.0], [], received=now)
    return node.tick(now).command.mode


@pytest.mark.parametrize(
    ("before", "requests", "reason"),
    [
        (("start",), ("start",), "already ramping"),
        (("start", "wait"), ("start",), "the policy already runs"),
        (("estop",), ("start",), "the shield is in ESTOP, which only a reset leaves; reset, then start"),
        ((), ("estop", "start"), "an e-stop came with it"),
        ((), ("reset", "start", "reset"), "a reset received after it cancelled it"),
    ],
)
def test_a_start_the_node_does_not_carry_out_is_refused_with_its_reason(pendulum_bundle, before, requests, reason):
    """An operator's start is never dropped in silence: counted as a refusal and said on /diagnostics."""
    node, now = _passive_node(pendulum_bundle)
    for step in before:
        for _ in range(10 if step == "wait" else 1):
            _tick(node, now, *(() if step == "wait" else (step,)))
            now += DT
    assert node.refused["start"] == 0
    _tick(node, now, *requests)
    assert node.refused["start"] == 1 and reason in node.last_refusal, node.last_refusal
    report = node.diagnostics()
    assert report["level"] >= 1 and report["values"]["refused.start"] == "1"
    assert reason in report["values"]["last_refusal"] and node.changed.is_set()


def test_a_start_before_any_joint_state_is_refused_and_one_after_a_reset_in_the_ramp_ramps(pendulum_bundle) -> None:
    node = PolicyNode(pendulum_bundle, NodeConfig(shield=ShieldConfig(ramp_time=0.1)))
    node.start()
    node.tick(100.0)
    assert node.shield.mode == Mode.PASSIVE and "no valid joint state yet" in node.last_refusal
    node, now = _passive_node(pendulum_bundle)
    assert _tick(node, now, "start") == Mode.RAMP
    assert _tick(node, now + DT, "reset") == Mode.PASSIVE  # a reset abandons the ramp...
    assert _tick(node, now + 2 * DT, "start") == Mode.RAMP  # ...and the next start ramps again
    assert node.refused["start"] == 0


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ([1e308, 0.0, 0.4], "target[0] (value 0) = 1e+308: expected within [0.3, 0.6]"),
        ([0.5, np.finfo(float).max, 0.4], "target[1] (value 1) = 1.7976931348623157e+308"),
        ([0.5, 0.0, 1e6], "target[2] (value 2) = 1000000.0: expected within [0.2, 0.6]"),
        ([0.5, -0.31, 0.4], "target[1] (value 1) = -0.31: expected within [-0.3, 0.3]"),
    ],
)
def test_a_task_command_outside_the_trained_range_is_refused_by_name_and_never_observed(
    panda_bundle, values, named
) -> None:
    """The reach target's box travels in the bundle (`source.ranges`); a value outside it (1e308 would be
    inf in the float32 observation) is refused naming the topic, the value and the range."""
    node = PolicyNode(
        panda_bundle, NodeConfig(autostart=True, require_subscriber=False, shield=ShieldConfig(ramp_time=0.1))
    )
    assert node.on_task_command([0.5, 0.0, 0.4]) is None
    reason = node.on_task_command(values)
    assert reason is not None and reason.startswith(f"command: /q2real_policy/command: {named}"), reason
    assert node.refused["command"] == 1 and node.diagnostics()["values"]["last_refusal"] == reason
    terms = node.bundle.info.metadata["observation"]["terms"]
    start = sum(t["dim"] for t in terms[: [t["name"] for t in terms].index("target")])
    pose = [float(v) for v in node.spec.array("default_position")]
    now = 100.0
    for _ in range(30):
        node.on_joint_state(list(node.joints), pose, [0.0] * len(pose), [], received=now)
        tick = node.tick(now)
        now += DT
        if tick.observation is not None:
            break
    assert tick.observation is not None
    np.testing.assert_allclose(tick.observation.reshape(-1)[start : start + 3], [0.5, 0.0, 0.4], rtol=1e-6)


def test_a_bundle_without_command_ranges_bounds_commands_by_the_documented_limit(panda_bundle, tmp_path) -> None:
    def strip(meta: dict) -> None:
        for term in meta["observation"]["terms"]:
            term["source"].pop("ranges", None)

    node = PolicyNode(_rewritten(panda_bundle, tmp_path, strip))
    assert node.on_task_command([0.5, 0.0, 50.0]) is None
    reason = node.on_task_command([0.5, 0.0, 1e6])
    assert reason is not None and "target[2] (value 2) = 1000000.0: expected within +-100" in reason
    assert "gives no range" in reason


def test_a_robot_with_more_joints_than_the_compiled_shield_takes_is_refused_saying_so(
    pendulum_bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled shield's joint limit (`MAX_JOINTS`, 128) lowered to below the pendulum's one joint."""
    import q2real.deploy_ros.node

    monkeypatch.setattr(q2real.deploy_ros.node, "MAX_JOINTS", 0)
    with pytest.raises(BundleError, match=r"metadata\.robot: 1 joints; the compiled shield .* takes at most 0"):
        PolicyNode(pendulum_bundle)


def test_an_autostart_the_shield_refuses_is_said_once_and_starts_when_the_robot_comes_near(tmp_path) -> None:
    """An arm sagging under a payload, too far from the default pose to ramp: autostart is refused, said
    and counted once (not per tick), and ramps as soon as the arm is back within reach."""
    node = PolicyNode(export_fresh_agent("panda_reach", tmp_path / "panda.onnx"), NodeConfig(autostart=True))
    assert node.on_task_command([0.5, 0.0, 0.4]) is None
    pose = np.array([float(v) for v in node.spec.array("default_position")])
    sagged = pose + np.where(np.arange(pose.size) == 1, 1.4, 0.0)  # the shoulder 1.4 rad down
    now = 100.0
    for _ in range(20):
        node.on_joint_state(list(node.joints), list(sagged), [0.0] * pose.size, [], received=now)
        node.tick(now)
        now += DT
    assert node.shield.mode == Mode.PASSIVE
    assert node.refused["autostart"] == 1 and "autostart: ramp refused" in node.last_refusal, node.refused
    assert node.shield.counters.rules["RAMP_REFUSED"] == 0, "not a refused ramp per tick"
    assert node.diagnostics()["values"]["last_refusal"].startswith("autostart: ramp refused")
    for _ in range(2):  # a start ramps from the pose the shield measured on the tick before
        node.on_joint_state(list(node.joints), list(pose), [0.0] * pose.size, [], received=now)
        node.tick(now)
        now += DT
    assert node.shield.mode == Mode.RAMP and node.refused["autostart"] == 1


def test_a_ramp_says_whether_the_operator_or_autostart_began_it(pendulum_bundle) -> None:
    for autostart, by in ((True, "autostart"), (False, "operator start")):
        node = PolicyNode(pendulum_bundle, NodeConfig(autostart=autostart))
        for now in (100.0, 100.02):  # the first tick measures the pose a ramp starts from
            node.on_joint_state(["hinge"], [0.0], [0.0], [], received=now)
            if not autostart and now > 100.0:
                node.start()
            node.tick(now)
        assert node.shield.mode == Mode.RAMP
        assert node.last_reason == f"{by}: ramping from the measured pose to the default pose"
