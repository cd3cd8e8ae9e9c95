"""Bundles that lie about the robot: every robot-fact rule a spec file obeys, a bundle's robot section
obeys too, and the refusal names the field; a bundle that disagrees with this machine's spec does not
start; graphs whose outputs are not real-valued commands are refused."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from q2real.cli.main import main
from q2real.contracts.schema import METADATA_KEY, BundleError, parse_metadata, read_metadata, seal
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.settings import NodeConfig


@pytest.fixture(scope="module")
def panda_meta(panda_bundle: Path) -> dict:
    return read_metadata(panda_bundle)


def _rewrite(bundle: Path, target: Path, meta: dict | str) -> Path:
    model = onnx.load(str(bundle))
    entry = next(p for p in model.metadata_props if p.key == METADATA_KEY)
    entry.value = meta if isinstance(meta, str) else json.dumps(meta)
    onnx.save(model, str(target))
    seal(target)  # resealed: what is tested is the field, not the digest
    return target


def _limit(meta: dict, i: int, side: int) -> float:
    value = meta["robot"]["position_limits"][i][side]
    return (-math.inf, math.inf)[side] if value is None else value


# Each rule: (how to break it at joint i, the field the refusal must name). `r` is metadata.robot.
RULES = {
    "velocity limit not positive": (
        lambda m, i, x: m["robot"]["velocity_limits"].__setitem__(i, -abs(x)),
        "metadata.robot.velocity_limits[{i}]",
    ),
    "effort limit not positive": (
        lambda m, i, x: m["robot"]["effort_limits"].__setitem__(i, -abs(x)),
        "metadata.robot.effort_limits[{i}]",
    ),
    "zero velocity limit": (
        lambda m, i, x: m["robot"]["velocity_limits"].__setitem__(i, 0.0),
        "metadata.robot.velocity_limits[{i}]",
    ),
    "limits not ordered": (
        lambda m, i, x: m["robot"]["position_limits"].__setitem__(i, [abs(x) + 1.0, -abs(x)]),
        "metadata.robot.position_limits[{i}]",
    ),
    "equal limits": (
        lambda m, i, x: m["robot"]["position_limits"].__setitem__(i, [x, x]),
        "metadata.robot.position_limits[{i}]",
    ),
    "default pose outside the limits": (
        lambda m, i, x: m["robot"]["default_pose"].__setitem__(i, _limit(m, i, 1) + abs(x) + 1e-3),
        "metadata.robot.default_pose[{i}]",
    ),
    "negative kp": (lambda m, i, x: m["robot"]["kp"].__setitem__(i, -abs(x) - 1e-6), "metadata.robot.kp[{i}]"),
    "negative kd": (lambda m, i, x: m["robot"]["kd"].__setitem__(i, -abs(x) - 1e-6), "metadata.robot.kd[{i}]"),
    "zero kp under position control": (
        lambda m, i, x: m["robot"]["kp"].__setitem__(i, 0.0),
        "metadata.robot.kp[{i}]",
    ),
    "duplicate joint names": (
        lambda m, i, x: m["robot"]["joint_names"].__setitem__(i, m["robot"]["joint_names"][i - 1]),
        "metadata.robot.joint_names: duplicate",
    ),
    "empty joint name": (lambda m, i, x: m["robot"]["joint_names"].__setitem__(i, ""), "metadata.robot.joint_names"),
    "unknown control mode": (lambda m, i, x: m["robot"].__setitem__("control_mode", "positon"), "control_mode"),
    "robot name is a path": (lambda m, i, x: m["robot"].__setitem__("name", "../../etc/panda"), "metadata.robot.name"),
    "malformed robot hash": (lambda m, i, x: m["robot"].__setitem__("sha256", "abc"), "metadata.robot.sha256"),
    "action offset outside the limits": (
        lambda m, i, x: m["action"]["offset"].__setitem__(i, _limit(m, i, 0) - abs(x) - 1.0),
        "metadata.action.offset[{i}]",
    ),
    "negative action scale": (
        lambda m, i, x: m["action"]["scale"].__setitem__(i, -abs(x) - 1e-3),
        "metadata.action.scale",
    ),
    "non-finite limit": (
        lambda m, i, x: m["robot"]["effort_limits"].__setitem__(i, math.inf),
        "metadata.robot.effort_limits",
    ),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rule=st.sampled_from(sorted(RULES)),
    joint=st.integers(0, 6),
    value=st.floats(0.0, 1e6, allow_nan=False),
)
def test_every_robot_fact_rule_is_enforced_on_bundles_naming_the_field(panda_meta, rule, joint, value) -> None:
    meta = copy.deepcopy(panda_meta)
    joint = max(joint, 1) if rule == "duplicate joint names" else joint
    breaks, field = RULES[rule]
    breaks(meta, joint, value)
    with pytest.raises(BundleError) as err:
        parse_metadata(json.dumps(meta), "bad.onnx")
    assert str(err.value).startswith("bad.onnx: ") and field.format(i=joint) in str(err.value), (rule, err.value)


@pytest.mark.parametrize(
    "rule", ["negative kd", "unknown control mode", "duplicate joint names", "zero kp under position control"]
)
def test_the_bundle_loader_and_the_node_refuse_such_bundle_files(panda_bundle, panda_meta, tmp_path, rule) -> None:
    meta = copy.deepcopy(panda_meta)
    breaks, field = RULES[rule]
    breaks(meta, 2, 1.0)
    bad = _rewrite(panda_bundle, tmp_path / "bad.onnx", meta)
    for load in (PolicyBundle, read_metadata, PolicyNode):
        with pytest.raises(BundleError, match=field.format(i=2).replace("[", r"\[").replace("]", r"\]")):
            load(bad)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("control_period",), "metadata.control_period"),
        (("robot", "velocity_limits"), "metadata.robot.velocity_limits"),
    ],
)
def test_integers_too_large_for_a_float_are_refused_naming_the_field(panda_meta, path, field) -> None:
    meta = copy.deepcopy(panda_meta)
    huge = 10**400
    if len(path) == 1:
        meta[path[0]] = huge
    else:
        meta[path[0]][path[1]][0] = huge
    with pytest.raises(BundleError, match=field):
        parse_metadata(json.dumps(meta), "bad.onnx")


def test_hostile_fields_are_echoed_only_in_brief(panda_bundle, panda_meta, tmp_path) -> None:
    meta = copy.deepcopy(panda_meta)
    meta["robot"]["joint_names"] = ["x" * 1_000_000] * 7
    with pytest.raises(BundleError) as err:
        PolicyBundle(_rewrite(panda_bundle, tmp_path / "big.onnx", meta))
    assert "metadata.robot.joint_names[0]" in str(err.value) and len(str(err.value)) < 1000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "metadata: not valid JSON"),
        ('{"schema_version": 1, "observation": "x"}', "metadata.observation.dim: missing"),
        ("[]", "metadata: expected a JSON object"),
        ('{"schema_version": 1, "observation": {"dim": 1' + "0" * 400 + "}}", "metadata.action.dim: missing"),
    ],
)
def test_unparseable_metadata_is_refused_not_raised_raw(panda_bundle, tmp_path, text, message) -> None:
    with pytest.raises(BundleError, match=message):
        PolicyBundle(_rewrite(panda_bundle, tmp_path / "bad.onnx", text))


def _hand_made_bundle(meta: dict, path: Path, second: onnx.NodeProto, output_type, extra=()) -> Path:
    """obs @ zeros -> `second` -> actions, with `meta` as its metadata."""
    obs_dim, act_dim = meta["observation"]["dim"], meta["action"]["dim"]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w"], ["y"]), second],
        "policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs_dim])],
        [helper.make_tensor_value_info("actions", output_type, ["batch", act_dim])],
        initializer=[
            helper.make_tensor("w", TensorProto.FLOAT, [obs_dim, act_dim], np.zeros(obs_dim * act_dim)),
            *extra,
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(meta)
    onnx.save(model, str(path))
    seal(path)
    return path


@pytest.mark.parametrize("kind", [TensorProto.INT64, TensorProto.BOOL])
def test_integer_and_boolean_graph_outputs_are_not_actions(panda_meta, tmp_path, kind) -> None:
    # A graph that runs and has the right shape, but whose output is not a command.
    cast = helper.make_node("Cast", ["y"], ["actions"], to=kind)
    bundle = _hand_made_bundle(panda_meta, tmp_path / "int.onnx", cast, kind)
    with pytest.raises(BundleError, match=r"graph I/O types: .*-> tensor\((int64|bool)\)"):
        PolicyBundle(bundle)


def test_a_graph_that_fails_at_run_time_is_refused_naming_the_bundle(panda_meta, tmp_path) -> None:
    # Reshape to a fixed batch of 3: it loads, then fails on the probe batches.
    reshape = helper.make_node("Reshape", ["y", "shape"], ["actions"])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [3, panda_meta["action"]["dim"]])
    bundle = _hand_made_bundle(panda_meta, tmp_path / "fails.onnx", reshape, TensorProto.FLOAT, [shape])
    with pytest.raises(BundleError, match=r"fails\.onnx: graph fails on a batch of 1 zero observations"):
        PolicyBundle(bundle)


def test_a_bundle_whose_robot_differs_from_this_machines_spec_does_not_start(pendulum_bundle, tmp_path) -> None:
    meta = read_metadata(pendulum_bundle)
    meta["robot"]["velocity_limits"] = [30.0]  # valid, and not the robot's 12 rad/s
    edited = _rewrite(pendulum_bundle, tmp_path / "fast.onnx", meta)
    with pytest.raises(BundleError, match=r"joints\.hinge\.velocity_limit: 30\.0 vs 12\.0.*allow_robot_mismatch"):
        PolicyNode(edited)
    node = PolicyNode(edited, NodeConfig(allow_robot_mismatch=True))
    assert node.robot_mismatch == ["joints.hinge.velocity_limit: 30.0 vs 12.0"]
    assert node.diagnostics()["values"]["robot_mismatch"].startswith("joints.hinge.velocity_limit")
    assert node.shield.max_velocity.tolist() == [12.0], "an allowed mismatch must not loosen the robot's limits"

    meta = read_metadata(pendulum_bundle)
    meta["robot"]["effort_limits"] = [200.0]  # the robot's motor gives 2 N m
    node = PolicyNode(_rewrite(pendulum_bundle, tmp_path / "strong.onnx", meta), NodeConfig(allow_robot_mismatch=True))
    assert node.shield.max_effort.tolist() == [2.0]

    meta = read_metadata(pendulum_bundle)
    meta["robot"]["sha256"] = "0" * 64  # every field equal, other files
    with pytest.raises(BundleError, match=r"sha256 \(spec \+ model files\): bundle 000000000000 vs local"):
        PolicyNode(_rewrite(pendulum_bundle, tmp_path / "hash.onnx", meta))

    meta = read_metadata(pendulum_bundle)
    meta["robot"]["name"] = "t800"
    with pytest.raises(BundleError, match="no spec of robot 't800' on this machine"):
        PolicyNode(_rewrite(pendulum_bundle, tmp_path / "t800.onnx", meta))


def test_the_local_spec_may_be_named_by_path(pendulum_bundle) -> None:
    from q2real.hardware.spec import HARDWARE_DIR

    node = PolicyNode(pendulum_bundle, NodeConfig(robot=str(HARDWARE_DIR / "pendulum" / "robot.yaml")))
    assert node.robot_mismatch == []
    with pytest.raises(BundleError, match=r"joint_names: \['hinge'\] vs \['slider'\]"):
        PolicyNode(pendulum_bundle, NodeConfig(robot="cartpole"))


def test_deploy_over_dds_refuses_a_bad_but_parseable_bundle_before_anything_starts(
    panda_bundle, panda_meta, tmp_path, capsys, dds_domain
) -> None:
    meta = copy.deepcopy(panda_meta)
    meta["robot"]["effort_limits"][3] = -87.0
    bad = _rewrite(panda_bundle, tmp_path / "bad.onnx", meta)
    assert main(["deploy", str(bad), "--sim", "--duration", "3"]) == 2
    err = capsys.readouterr().err
    assert "metadata.robot.effort_limits[3] (joint 'joint4')" in err and "expected a finite number > 0" in err


def test_an_observation_term_listing_a_joint_twice_is_refused(panda_bundle, panda_meta, tmp_path) -> None:
    meta = copy.deepcopy(panda_meta)
    term = next(t for t in meta["observation"]["terms"] if t["source"]["kind"] == "joint_velocity")
    joints = term["source"]["joints"]
    joints[1] = joints[0]  # same width, one joint read twice and another never
    with pytest.raises(BundleError, match=rf"source\.joints: \['{joints[0]}'\] listed more than once"):
        PolicyNode(_rewrite(panda_bundle, tmp_path / "twice.onnx", meta))


def test_metadata_that_is_not_utf8_is_a_bundle_error(panda_bundle, tmp_path) -> None:
    """A flipped byte in the metadata text: the ONNX loads, its metadata cannot be decoded."""
    data = panda_bundle.read_bytes()
    assert data.count(b'"schema_version"') == 1
    bad = tmp_path / "flipped.onnx"
    bad.write_bytes(data.replace(b'"schema_version"', b'"schema\xa0version"'))
    with pytest.raises(BundleError, match="damaged or edited after export"):
        PolicyBundle(bad)
    seal(bad)  # an editor that also reseals
    with pytest.raises(BundleError, match="metadata_props are not UTF-8 text"):
        PolicyBundle(bad)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.floats(0.0, 1.0, exclude_max=True), bit=st.integers(0, 7))
def test_any_flipped_bit_is_refused_as_a_bundle_error(panda_bundle, tmp_path, where: float, bit: int) -> None:
    """In a weight, in the metadata, in the digest or in the protobuf framing: never a raw exception,
    never a bundle that loads."""
    data = bytearray(panda_bundle.read_bytes())
    data[int(where * len(data))] ^= 1 << bit
    bad = tmp_path / "flipped.onnx"
    bad.write_bytes(bytes(data))
    with pytest.raises(BundleError):
        PolicyBundle(bad)


def test_a_flipped_weight_names_the_digest_and_a_bundle_without_one_is_refused(panda_bundle, tmp_path) -> None:
    model = onnx.load(str(panda_bundle))
    weight = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    data = panda_bundle.read_bytes()
    at = data.index(weight.raw_data) + len(weight.raw_data) // 2
    flipped = tmp_path / "weight.onnx"
    flipped.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :])
    with pytest.raises(BundleError, match=r"weight\.onnx: its bytes hash to sha256 .* the bundle records"):
        PolicyBundle(flipped)
    seal(flipped)
    PolicyBundle(flipped)  # the same flip, resealed, loads and runs: only the digest caught it

    del model.metadata_props[-1]  # the digest entry
    unsealed = tmp_path / "unsealed.onnx"
    onnx.save(model, str(unsealed))
    with pytest.raises(BundleError, match="0 'q2real.sha256' entries, expected one"):
        PolicyBundle(unsealed)


@pytest.mark.parametrize("keep", [0.0, 0.01, 0.5, 0.999])
def test_a_truncated_bundle_is_a_bundle_error(panda_bundle, tmp_path, keep: float) -> None:
    data = panda_bundle.read_bytes()
    short = tmp_path / "short.onnx"
    short.write_bytes(data[: int(keep * len(data))])
    with pytest.raises(BundleError):
        PolicyBundle(short)
