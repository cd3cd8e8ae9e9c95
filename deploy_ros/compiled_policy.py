"""The policy graph compiled for one observation at a time: the node's per-tick call without ONNX
Runtime's per-run overhead.

ONNX Runtime spends tens of microseconds per run on dispatch, and after the 2 ms a 500 Hz node sleeps
between ticks its large code path runs from cold caches: about 100 µs for a 256-wide MLP that is
30 µs of arithmetic. A tick always runs a batch of one, so every shape in the graph is static and a
tensor of batch one is, in memory, a flat vector. The graph is lowered to loops over flat float32
vectors and compiled once (numba, cached on disk per graph structure; the weights are arguments, so a
fine-tuned version of the same network reuses the compiled code without compiling on the tick's
machine again).

What lowers: the element-wise, activation, matrix-product, normalization and layout operators that
MLP actors export to, on tensors whose leading dimensions are one. Anything else (an ensemble's
batched product, a gather on data, an operator not listed) is not lowered, and the node runs ONNX
Runtime, which stays the reference: a lowered graph is only used after it reproduced ONNX Runtime's
outputs on a set of observations (`PolicyBundle._compile`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from numba import njit
from onnx import numpy_helper

UNARY = {
    "Relu": "max(v, np.float32(0.0))",
    "Tanh": "np.tanh(v)",
    "Sigmoid": "np.float32(1.0) / (np.float32(1.0) + np.exp(-v))",
    "Exp": "np.exp(v)",
    "Log": "np.log(v)",
    "Sqrt": "np.sqrt(v)",
    "Neg": "-v",
    "Abs": "abs(v)",
    "Softplus": "np.log1p(np.exp(-abs(v))) + max(v, np.float32(0.0))",
}
BINARY = {
    "Add": "{a} + {b}",
    "Sub": "{a} - {b}",
    "Mul": "{a} * {b}",
    "Div": "{a} / {b}",
    "Max": "max({a}, {b})",
    "Min": "min({a}, {b})",
    "Pow": "{a} ** {b}",
}
ALIASES = {"Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten"}
"""Operators that change a tensor's shape but not its memory order: the same flat vector."""


class NotLowered(Exception):
    """The graph uses something the flat form does not express; the message says what."""


@dataclass
class Program:
    """The lowered graph: generated source, its constants and its buffers, in call order."""

    lines: list[str] = field(default_factory=list)
    constants: list[np.ndarray] = field(default_factory=list)
    buffers: list[np.ndarray] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    """ONNX value name -> the generated code's argument that holds it (dynamic values only)."""

    def constant(self, value: np.ndarray) -> str:
        self.constants.append(np.ascontiguousarray(value, dtype=np.float32))
        return f"c{len(self.constants) - 1}"

    def buffer(self, size: int) -> str:
        self.buffers.append(np.zeros(size, dtype=np.float32))
        return f"t{len(self.buffers) - 1}"


def _attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _reference(node: onnx.NodeProto, inputs: list[Any]) -> list[np.ndarray]:
    """numpy semantics of the supported operators (constant folding and shapes at batch one)."""
    op = node.op_type
    x = inputs[0] if inputs else None
    if op == "Constant":
        return [numpy_helper.to_array(_attribute(node, "value"))]
    assert x is not None
    if op in ALIASES:
        if op == "Identity":
            return [x]
        if op == "Reshape":
            shape = [x.shape[i] if s == 0 else s for i, s in enumerate(inputs[1])]
            return [x.reshape(shape)]
        if op == "Flatten":
            axis = _attribute(node, "axis", 1) % max(x.ndim, 1)
            return [x.reshape(int(np.prod(x.shape[:axis])), -1)]
        axes = inputs[1] if len(inputs) > 1 and inputs[1] is not None else _attribute(node, "axes")
        if op == "Unsqueeze":
            out = x
            for axis in sorted(int(a) % (x.ndim + len(axes)) for a in axes):
                out = np.expand_dims(out, axis)
            return [out]
        return [np.squeeze(x, axis=None if axes is None else tuple(int(a) for a in axes))]
    if op in UNARY:
        functions = {
            "Relu": lambda v: np.maximum(v, 0),
            "Tanh": np.tanh,
            "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
            "Exp": np.exp,
            "Log": np.log,
            "Sqrt": np.sqrt,
            "Neg": np.negative,
            "Abs": np.abs,
            "Softplus": lambda v: np.log1p(np.exp(-np.abs(v))) + np.maximum(v, 0),
        }
        return [functions[op](x).astype(x.dtype)]
    if op in BINARY:
        functions = {
            "Add": np.add,
            "Sub": np.subtract,
            "Mul": np.multiply,
            "Max": np.maximum,
            "Min": np.minimum,
            "Pow": np.power,
        }
        b = inputs[1]
        if op == "Div":
            out = np.floor_divide(x, b) if np.issubdtype(x.dtype, np.integer) else np.divide(x, b)
        else:
            out = functions[op](x, b)
        return [np.asarray(out).astype(np.result_type(x, b))]
    if op == "Clip":
        low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else -np.inf
        high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.inf
        return [np.clip(x, low, high).astype(x.dtype)]
    if op == "MatMul":
        return [np.matmul(x, inputs[1])]
    if op == "Gemm":
        a = x.T if _attribute(node, "transA", 0) else x
        b = inputs[1].T if _attribute(node, "transB", 0) else inputs[1]
        out = _attribute(node, "alpha", 1.0) * (a @ b)
        if len(inputs) > 2 and inputs[2] is not None:
            out = out + _attribute(node, "beta", 1.0) * inputs[2]
        return [out.astype(np.float32)]
    if op == "Shape":
        return [np.array(x.shape, dtype=np.int64)]
    if op == "ConstantOfShape":
        value = _attribute(node, "value")
        fill = numpy_helper.to_array(value) if value is not None else np.zeros(1, dtype=np.float32)
        return [np.full(tuple(int(d) for d in x), fill.reshape(-1)[0], dtype=fill.dtype)]
    if op == "Gather":
        return [np.take(x, inputs[1], axis=_attribute(node, "axis", 0))]
    if op == "Slice":
        starts, ends = inputs[1], inputs[2]
        axes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else range(len(starts))
        steps = inputs[4] if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
        index = [slice(None)] * x.ndim
        for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
            index[int(a)] = slice(int(s), int(e), int(st))
        return [x[tuple(index)]]
    if op == "Concat":
        return [np.concatenate(inputs, axis=_attribute(node, "axis"))]
    if op in ("ReduceMean", "ReduceSum"):
        axes = inputs[1] if len(inputs) > 1 else _attribute(node, "axes")
        axes = None if axes is None else tuple(int(a) for a in axes)
        keep = bool(_attribute(node, "keepdims", 1))
        reduce = np.mean if op == "ReduceMean" else np.sum
        return [reduce(x, axis=axes, keepdims=keep).astype(x.dtype)]
    if op == "LayerNormalization":
        axis = _attribute(node, "axis", -1)
        eps = _attribute(node, "epsilon", 1e-5)
        axes = tuple(range(axis % x.ndim, x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
        out = (x - mean) / np.sqrt(var + eps) * inputs[1]
        if len(inputs) > 2 and inputs[2] is not None:
            out = out + inputs[2]
        return [out.astype(x.dtype)]
    raise NotLowered(f"operator {op} ({node.name or 'unnamed'}) is not compiled")


def _leading_ones(shape: tuple[int, ...], upto: int) -> bool:
    return all(d == 1 for d in shape[:upto])


class _Lowering:
    def __init__(self, model: onnx.ModelProto, obs_dim: int):
        self.graph = model.graph
        self.program = Program()
        self.values: dict[str, np.ndarray] = {}
        """Every value at batch one: constants exactly, dynamic ones as traced on a zero observation."""
        self.dynamic: set[str] = set()
        for tensor in self.graph.initializer:
            self.values[tensor.name] = numpy_helper.to_array(tensor)
        (graph_input,) = [i for i in self.graph.input if i.name not in self.values]
        self.values[graph_input.name] = np.zeros((1, obs_dim), dtype=np.float32)
        self.dynamic.add(graph_input.name)
        self.program.names[graph_input.name] = "x"

    def run(self) -> Program:
        for node in self.graph.node:
            inputs = [self.values[name] if name else None for name in node.input]
            outputs = _reference(node, inputs)
            if len([name for name in node.output if name]) > 1:
                raise NotLowered(f"{node.op_type} ({node.name}) with more than one output")
            live = any(name in self.dynamic for name in node.input)
            self.values[node.output[0]] = outputs[0]
            if live and node.op_type != "Shape":  # a shape is static at batch one
                self._emit(node)
        for output in self.graph.output:
            if output.name not in self.dynamic:
                raise NotLowered(f"output {output.name} does not depend on the observation")
        return self.program

    def _arg(self, name: str, shape: tuple[int, ...]) -> str:
        """The flat argument holding input `name` broadcast to `shape` (constants are broadcast here)."""
        if name in self.dynamic:
            return self.program.names[name]
        return self.program.constant(np.broadcast_to(self.values[name], shape).reshape(-1))

    def _out(self, node: onnx.NodeProto, alias: str | None = None) -> str:
        name = node.output[0]
        self.dynamic.add(name)
        value = self.values[name]
        if value.dtype != np.float32:
            raise NotLowered(f"{node.op_type} ({node.name}) yields {value.dtype} from the observation")
        self.program.names[name] = alias or self.program.buffer(value.size)
        return self.program.names[name]

    def _emit(self, node: onnx.NodeProto) -> None:
        op, lines = node.op_type, self.program.lines
        shape = self.values[node.output[0]].shape
        size = int(np.prod(shape))
        x = node.input[0]
        if op in ALIASES:
            self._out(node, self.program.names[x])
        elif op in UNARY:
            a, y = self.program.names[x], self._out(node)
            lines += [f"for i in range({size}):", f"    v = {a}[i]", f"    {y}[i] = {UNARY[op]}"]
        elif op in BINARY:
            args = []
            for name in node.input:
                n = self.values[name].size
                if name in self.dynamic and n not in (1, size):
                    raise NotLowered(f"{op} ({node.name}) broadcasts a computed tensor of {n} to {size}")
                args.append(f"{self._arg(name, shape)}[{'0' if name in self.dynamic and n == 1 < size else 'i'}]")
            y = self._out(node)
            expression = BINARY[op].format(a=args[0], b=args[1])
            lines += [f"for i in range({size}):", f"    {y}[i] = np.float32({expression})"]
        elif op == "Clip":
            if any(name in self.dynamic for name in node.input[1:]):
                raise NotLowered(f"Clip ({node.name}) has computed bounds")
            low = self._arg(node.input[1], shape) if len(node.input) > 1 and node.input[1] else None
            high = self._arg(node.input[2], shape) if len(node.input) > 2 and node.input[2] else None
            a, y = self.program.names[x], self._out(node)
            lines += [f"for i in range({size}):", f"    v = {a}[i]"]
            if low:
                lines.append(f"    v = max(v, {low}[i])")
            if high:
                lines.append(f"    v = min(v, {high}[i])")
            lines.append(f"    {y}[i] = v")
        elif op in ("MatMul", "Gemm"):
            self._product(node)
        elif op == "Slice":
            self._slice(node)
        elif op == "Concat":
            self._concat(node)
        elif op in ("ReduceMean", "ReduceSum"):
            value = self.values[x]
            if size != 1:
                raise NotLowered(f"{op} ({node.name}) keeps {size} values; only a reduction to one is compiled")
            a, y = self.program.names[x], self._out(node)
            scale = f" / np.float32({value.size})" if op == "ReduceMean" else ""
            lines += ["s = np.float32(0.0)", f"for i in range({value.size}):", f"    s += {a}[i]"]
            lines.append(f"{y}[0] = np.float32(s{scale})")
        elif op == "LayerNormalization":
            self._layer_norm(node, shape)
        else:
            raise NotLowered(f"operator {op} ({node.name}) on the observation is not compiled")

    def _product(self, node: onnx.NodeProto) -> None:
        x, w = node.input[0], node.input[1]
        if w in self.dynamic or x not in self.dynamic:
            raise NotLowered(f"{node.op_type} ({node.name}): only (computed) x (weights) is compiled")
        a_value, weights = self.values[x], self.values[w].astype(np.float32)
        if node.op_type == "Gemm":
            if _attribute(node, "transA", 0):
                raise NotLowered(f"Gemm ({node.name}) with transA")
            if _attribute(node, "transB", 0):
                weights = weights.T
            weights = weights * np.float32(_attribute(node, "alpha", 1.0))
        if a_value.ndim < 2 or not _leading_ones(a_value.shape, a_value.ndim - 1):
            raise NotLowered(f"{node.op_type} ({node.name}) on a computed tensor of shape {a_value.shape}")
        if weights.ndim < 2 or not _leading_ones(weights.shape, weights.ndim - 2):
            raise NotLowered(f"{node.op_type} ({node.name}) with batched weights {weights.shape} (an ensemble)")
        k, m = weights.shape[-2:]
        a = self.program.names[x]
        w_arg = self.program.constant(weights.reshape(k, m))
        bias = None
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            beta = np.float32(_attribute(node, "beta", 1.0))
            bias = self.program.constant(np.broadcast_to(self.values[node.input[2]] * beta, (1, m)).reshape(-1))
        y = self._out(node)
        lines = self.program.lines
        lines += [f"for j in range({m}):", f"    {y}[j] = {bias + '[j]' if bias else 'np.float32(0.0)'}"]
        lines += [
            f"for i in range({k}):",
            f"    v = {a}[i]",
            f"    for j in range({m}):",
            f"        {y}[j] += v * {w_arg}[i, j]",
        ]

    def _slice(self, node: onnx.NodeProto) -> None:
        x = node.input[0]
        value = self.values[x]
        starts, ends = self.values[node.input[1]], self.values[node.input[2]]
        axes = self.values[node.input[3]] if len(node.input) > 3 and node.input[3] else np.arange(len(starts))
        steps = self.values[node.input[4]] if len(node.input) > 4 and node.input[4] else np.ones(len(starts))
        index = np.arange(value.size).reshape(value.shape)
        selection = [slice(None)] * value.ndim
        for s, e, axis, step in zip(starts, ends, axes, steps, strict=True):
            selection[int(axis)] = slice(int(s), int(e), int(step))
        picked = index[tuple(selection)].reshape(-1)
        if picked.size and not np.array_equal(picked, np.arange(picked[0], picked[0] + picked.size)):
            raise NotLowered(f"Slice ({node.name}) does not take a contiguous run of {value.shape}")
        start = int(picked[0]) if picked.size else 0
        a, y = self.program.names[x], self._out(node)
        self.program.lines += [f"for i in range({picked.size}):", f"    {y}[i] = {a}[i + {start}]"]

    def _concat(self, node: onnx.NodeProto) -> None:
        axis = _attribute(node, "axis") % self.values[node.input[0]].ndim
        parts = [(name, self.values[name]) for name in node.input]
        if not all(_leading_ones(v.shape, axis) for _, v in parts):
            raise NotLowered(f"Concat ({node.name}) along axis {axis} is not a flat concatenation")
        y, offset = self._out(node), 0
        for name, value in parts:
            a = self._arg(name, value.shape)
            self.program.lines += [f"for i in range({value.size}):", f"    {y}[i + {offset}] = {a}[i]"]
            offset += value.size

    def _layer_norm(self, node: onnx.NodeProto, shape: tuple[int, ...]) -> None:
        axis = _attribute(node, "axis", -1) % len(shape)
        if not _leading_ones(shape, axis):
            raise NotLowered(f"LayerNormalization ({node.name}) over {shape} from axis {axis}")
        size = int(np.prod(shape))
        eps = np.float32(_attribute(node, "epsilon", 1e-5))
        scale = self._arg(node.input[1], shape)
        bias = self._arg(node.input[2], shape) if len(node.input) > 2 and node.input[2] else None
        a, y = self.program.names[node.input[0]], self._out(node)
        self.program.lines += [
            "s = np.float32(0.0)",
            f"for i in range({size}):",
            f"    s += {a}[i]",
            f"mean = np.float32(s / np.float32({size}))",
            "s = np.float32(0.0)",
            f"for i in range({size}):",
            f"    d = {a}[i] - mean",
            "    s += d * d",
            f"inv = np.float32(1.0) / np.sqrt(np.float32(s / np.float32({size})) + np.float32({float(eps)!r}))",
            f"for i in range({size}):",
            f"    {y}[i] = np.float32(({a}[i] - mean) * inv * {scale}[i]{' + ' + bias + '[i]' if bias else ''})",
        ]


def lower(model: onnx.ModelProto, obs_dim: int) -> Program:
    """The graph for a batch of one as a flat-vector program; raises NotLowered with the reason."""
    return _Lowering(model, obs_dim).run()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "q2real" / "policies"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        return Path(tempfile.mkdtemp(prefix="q2real-policies-"))


_COMPILED: dict[str, Callable] = {}
"""Compiled programs of this process by source hash: a swapped version of the same network reuses one."""


def _packed(arrays: list[np.ndarray], letter: str) -> tuple[np.ndarray, list[str]]:
    """The arrays as one flat float32 array and the lines that view each back under its name: a
    call with three arguments is dispatched faster than one with dozens."""
    packed = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(1, dtype=np.float32)
    lines, offset = [], 0
    for i, array in enumerate(arrays):
        view = f"{letter}[{offset}:{offset + array.size}]"
        lines.append(f"{letter}{i} = {view}.reshape({array.shape})" if array.ndim > 1 else f"{letter}{i} = {view}")
        offset += array.size
    return packed.astype(np.float32), lines


def compile_program(program: Program, outputs: list[str]) -> tuple[Callable[..., None], np.ndarray, np.ndarray]:
    """One numba function `(x, out0, [out1], constants, workspace)` for the program, with its packed
    constants and workspace. Its source is written to the user's cache so numba's on-disk cache
    serves the next start."""
    constants, views = _packed(program.constants, "c")
    workspace, buffer_views = _packed(program.buffers, "t")
    arguments = ["x", *[f"out{i}" for i in range(len(outputs))], "c", "t"]
    body = views + buffer_views + list(program.lines)
    for i, name in enumerate(outputs):
        source = program.names[name]
        if source == "x":
            raise NotLowered(f"output {name} is the observation itself")
        size = program.buffers[int(source[1:])].size
        body += [f"for i in range({size}):", f"    out{i}[i] = {source}[i]"]
    array = "float32[::1]"
    signature = f"void({', '.join([array] * len(arguments))})"
    text = (
        "# Generated by q2real.deploy_ros.compiled_policy from a policy graph's structure.\n"
        "import numpy as np\nfrom numba import njit\n\n\n"
        f"@njit('{signature}', cache=True, nogil=True, error_model='numpy')\n"
        f"def run({', '.join(arguments)}):\n" + "".join(f"    {line}\n" for line in body)
    )
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    if digest not in _COMPILED:
        path = _cache_dir() / f"policy_{digest}.py"
        if not path.exists() or path.read_text() != text:
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(text)
            os.replace(partial, path)
        # Compiled (or loaded from numba's cache) as the module executes: the signature is explicit.
        spec = importlib.util.spec_from_file_location(f"q2real_policy_{digest}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # numba's cache re-imports the module by name when it loads
        spec.loader.exec_module(module)
        _COMPILED[digest] = module.run
    return _COMPILED[digest], constants, workspace


class CompiledPolicy:
    """`act` for one observation through the compiled program, writing into the caller's buffers.
    Compiles (or loads from the cache) at construction, so the first tick runs compiled code."""

    def __init__(self, model: onnx.ModelProto, obs_dim: int, outputs: list[np.ndarray]):
        program = lower(model, obs_dim)
        names = [o.name for o in model.graph.output]
        for value, name in zip(outputs, names, strict=True):
            source = program.names[name]
            if value.dtype != np.float32 or source == "x" or value.size != program.buffers[int(source[1:])].size:
                raise NotLowered(f"output {name}: the bound buffer is not float32 of the traced size")
        self._run, self._constants, self._workspace = compile_program(program, names)
        self._outputs = [o.reshape(-1) for o in outputs]
        self(np.zeros((1, obs_dim), dtype=np.float32))

    def __call__(self, obs: np.ndarray) -> None:
        """`obs`: (1, obs_dim) float32, C-contiguous."""
        self._run(obs.reshape(-1), *self._outputs, self._constants, self._workspace)


@njit(cache=True, nogil=True)
def action_from_commands(
    commands: np.ndarray, offset: np.ndarray, safe_scale: np.ndarray, scaled: np.ndarray
) -> tuple[np.ndarray, bool]:
    """`PolicyBundle.normalized` for one observation's commands, flat (a chunk's rows one after
    another), as float64, and whether every value is finite: one call where numpy takes six, each
    of which costs microseconds on the first tick after the node slept."""
    n = offset.size
    raw = np.empty(commands.size)
    finite = True
    for i in range(commands.size):
        j = i % n
        value = (commands[i] - offset[j]) / safe_scale[j] * scaled[j]
        raw[i] = value
        finite = finite and np.isfinite(value)
    return raw, finite
