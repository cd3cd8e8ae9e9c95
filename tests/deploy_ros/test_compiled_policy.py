"""The compiled policy against ONNX Runtime, the reference: operator by operator on a hand-built graph,
on real exported bundles, and the graphs it must leave to ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from onnx import TensorProto, helper, numpy_helper

from q2real.contracts.schema import BundleError
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.deploy_ros.compiled_policy import CompiledPolicy, NotLowered, lower
from tests.deploy_ros.conftest import export_fresh_agent

RNG = np.random.default_rng(7)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _model(nodes, initializers, outputs: list[tuple[str, list[int]]], obs_dim: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs_dim])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _every_operator() -> onnx.ModelProto:
    """obs (1, 5) through every operator the lowering knows, to two outputs."""
    f = np.float32
    init = [
        _const("mean", RNG.normal(size=5).astype(f)),
        _const("w1", RNG.normal(size=(8, 5)).astype(f)),  # Gemm with transB
        _const("b1", RNG.normal(size=8).astype(f)),
        _const("gamma", RNG.normal(size=8).astype(f)),
        _const("beta", RNG.normal(size=8).astype(f)),
        _const("w2", RNG.normal(size=(1, 16, 6)).astype(f)),  # an ensemble of one
        _const("two", np.array(2.0, f)),
        _const("half", np.array(0.5, f)),
        _const("lo", np.array(-0.8, f)),
        _const("hi", np.array(0.9, f)),
        _const("starts", np.array([2], np.int64)),
        _const("ends", np.array([6], np.int64)),
        _const("axes", np.array([-1], np.int64)),
        _const("unsq", np.array([0], np.int64)),
        _const("shape", np.array([1, 2, 2], np.int64)),
    ]
    n = helper.make_node
    nodes = [
        n("Sub", ["obs", "mean"], ["centred"]),
        n("Gemm", ["centred", "w1", "b1"], ["h1"], transB=1, alpha=0.7, beta=1.3),
        n("LayerNormalization", ["h1", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        n("Softplus", ["ln"], ["act0"]),
        n("Sigmoid", ["h1"], ["gate"]),
        n("Mul", ["act0", "gate"], ["gated"]),
        n("Tanh", ["h1"], ["t"]),
        n("Concat", ["gated", "t"], ["cat"], axis=1),
        n("Unsqueeze", ["cat", "unsq"], ["cat3"]),
        n("MatMul", ["cat3", "w2"], ["h2"]),
        n("Squeeze", ["h2", "unsq"], ["h2s"]),
        n("ReduceMean", ["h2s"], ["m"], keepdims=1),
        n("Sub", ["h2s", "m"], ["h2c"]),
        n("Pow", ["h2c", "two"], ["sq"]),
        n("Abs", ["h2c"], ["ab"]),
        n("Sqrt", ["ab"], ["rt"]),
        n("Max", ["sq", "rt"], ["mx"]),
        n("Min", ["mx", "two"], ["mn"]),
        n("Div", ["mn", "two"], ["dv"]),
        n("Neg", ["dv"], ["ng"]),
        n("Exp", ["ng"], ["ex"]),
        n("Add", ["ex", "half"], ["ad"]),
        n("Log", ["ad"], ["lg"]),
        n("Relu", ["lg"], ["rl"]),
        n("Clip", ["h2s", "lo", "hi"], ["cl"]),
        n("Slice", ["cl", "starts", "ends", "axes"], ["sl"]),
        n("Reshape", ["sl", "shape"], ["actions"]),
        n("Identity", ["rl"], ["cost_q"]),
    ]
    return _model(nodes, init, [("actions", ["batch", 2, 2]), ("cost_q", ["batch", 6])], 5)


def test_every_lowered_operator_matches_onnx_runtime() -> None:
    model = _every_operator()
    outputs = [np.zeros((1, 2, 2), np.float32), np.zeros((1, 6), np.float32)]
    compiled = CompiledPolicy(model, 5, outputs)
    obs = (RNG.normal(size=(64, 5)) * np.logspace(-2, 2, 64)[:, None]).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for row in range(len(obs)):
        compiled(obs[row : row + 1])
        for got, want in zip(outputs, session.run(None, {"obs": obs[row : row + 1]}), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_graphs_the_flat_form_cannot_express_are_named() -> None:
    ensemble = _model(
        [helper.make_node("MatMul", ["obs", "w"], ["actions"])],
        [_const("w", np.ones((2, 3, 4), np.float32))],
        [("actions", [2, "batch", 4])],
        3,
    )
    with pytest.raises(NotLowered, match=r"batched weights \(2, 3, 4\) \(an ensemble\)"):
        lower(ensemble, 3)
    unknown = _model([helper.make_node("Erf", ["obs"], ["actions"])], [], [("actions", ["batch", 3])], 3)
    with pytest.raises(NotLowered, match="operator Erf"):
        lower(unknown, 3)
    gathered = _model(
        [
            helper.make_node("Slice", ["obs", "s", "e", "a", "st"], ["actions"]),
        ],
        [
            _const("s", np.array([0], np.int64)),
            _const("e", np.array([4], np.int64)),
            _const("a", np.array([1], np.int64)),
            _const("st", np.array([2], np.int64)),
        ],
        [("actions", ["batch", 2])],
        4,
    )
    with pytest.raises(NotLowered, match="not take a contiguous run"):
        lower(gathered, 4)


def test_a_bundle_runs_compiled_when_asked_and_agrees_with_onnx_runtime(panda_bundle: Path) -> None:
    reference = PolicyBundle(panda_bundle)
    compiled = PolicyBundle(panda_bundle, runtime="compiled")
    assert reference.runtime == "onnxruntime" and compiled.runtime == "compiled"
    obs = (RNG.normal(size=(32, compiled.info.obs_dim)) * 3).astype(np.float32)
    for row in obs:
        want = reference.act(row[None])[0].copy()
        np.testing.assert_allclose(compiled.act(row[None])[0], want, rtol=1e-5, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(obs=arrays(np.float32, (1, 3), elements=st.floats(-1e6, 1e6, width=32)))
def test_the_compiled_pendulum_policy_agrees_on_any_observation(pendulum_bundle: Path, obs: np.ndarray) -> None:
    reference, compiled = _pair(pendulum_bundle)
    want = reference.act(obs)[0].copy()
    np.testing.assert_allclose(compiled.act(obs)[0], want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


_pairs: dict[Path, tuple[PolicyBundle, PolicyBundle]] = {}


def _pair(path: Path) -> tuple[PolicyBundle, PolicyBundle]:
    if path not in _pairs:
        _pairs[path] = (PolicyBundle(path), PolicyBundle(path, runtime="compiled"))
    return _pairs[path]


def test_a_graph_that_does_not_lower_runs_on_onnx_runtime_under_auto_and_is_refused_under_compiled(
    tmp_path: Path,
) -> None:
    """A safe bundle's cost critic is an ensemble: its product is batched over members."""
    path = export_fresh_agent("pendulum_swingup", tmp_path / "safe.onnx", algo="sac_lag")
    auto = PolicyBundle(path, runtime="auto")
    assert auto.runtime.startswith("onnxruntime (") and "not compiled" in auto.runtime
    with pytest.raises(BundleError, match=r"safe\.onnx: runtime compiled: "):
        PolicyBundle(path, runtime="compiled")


def test_the_ticks_action_is_the_normalized_commands_bit_for_bit_and_flags_what_is_not_finite(
    panda_bundle: Path,
) -> None:
    bundle = PolicyBundle(panda_bundle)
    for dtype in (np.float32, np.float64):
        commands = (RNG.normal(size=(200, 1, 3, 7)) * 5).astype(dtype)  # a chunk of 3 rows per tick
        for row in commands:
            raw, finite = bundle.action(row)
            assert finite and raw.dtype == np.float64
            np.testing.assert_array_equal(raw, bundle.normalized(row).astype(np.float64).reshape(-1))
    for bad in (np.nan, np.inf, -np.inf):
        row = np.zeros((1, 7), np.float32)
        row[0, 4] = bad
        assert not bundle.action(row)[1]
