"""Policy bundles: one ONNX file that carries its policy and everything a robot needs to run it.

The graph maps raw observations (`obs`, shape (batch, obs_dim)) to joint commands in the robot's
units (`actions`, shape (batch, action_dim), or (batch, chunk, action_dim) for a chunk policy, one row
per tick); observation normalization and action scaling are inside it. One JSON document under the
`q2real` metadata key (and in an identical `<file>.json` sidecar) describes the robot, the observation
layout, the action mapping, the control period, how chunks are executed and where the policy came
from. This module is what runs on the robot: it needs numpy, onnxruntime and the robot facts' validator
in `q2real.hardware`, which every robot section passes exactly as a spec file does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from q2real.contracts.schema import (
    METADATA_KEY,
    BundleError,
    BundleInfo,
    brief,
    check_seal,
    chunk_from_metadata,
    cost_from_metadata,
    parse_metadata,
)
from q2real.deploy_ros.compiled_policy import CompiledPolicy, NotLowered, action_from_commands
from q2real.deploy_ros.settings import PolicyRuntime

FLOAT_TENSORS = ("tensor(float)", "tensor(double)")
VERIFY_ROWS = 64


class PolicyBundle:
    """An ONNX policy ready to run: validated, single-threaded, sequential, no spinning, warmed up."""

    def __init__(self, path: str | Path, warmup: int = 20, runtime: PolicyRuntime = "onnxruntime"):
        self.path = Path(path)
        source = str(self.path)
        if not self.path.is_file():
            hint = f" (a directory; its bundle would be {self.path / 'policy.onnx'})" if self.path.is_dir() else ""
            raise BundleError(f"{source}: no such bundle file{hint}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        data = self.path.read_bytes()  # the bytes checked are the bytes run: the file is read once
        check_seal(data, source)
        try:
            self.session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        except Exception as err:
            raise BundleError(f"{source}: onnxruntime cannot load it: {err}") from err
        try:
            raw = self.session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
        except UnicodeDecodeError as err:
            raise BundleError(f"{source}: metadata: the ONNX metadata_props are not UTF-8 text ({err})") from None
        if raw is None:
            raise BundleError(f"{source}: metadata: no '{METADATA_KEY}' entry in the ONNX metadata_props")
        meta = parse_metadata(raw, source)
        self._check_sidecar(meta, source)
        self._check_io(meta, source)
        self.info = BundleInfo.of(meta)
        self._scale = np.asarray(meta["action"]["scale"], dtype=np.float32)
        self._offset = np.asarray(meta["action"]["offset"], dtype=np.float32)
        # `action_from_command`'s terms, computed once: this runs on every tick.
        self._safe_scale = self._scale + (self._scale == 0)
        self._scaled = self._scale != 0
        self._bind(meta)
        self._compiled = None
        self.runtime = "onnxruntime"
        """What runs `act`, and for ONNX Runtime under `auto`, why the compiled program does not."""
        self.compile_seconds = 0.0
        if runtime != "onnxruntime":
            began = time.perf_counter()
            reason = self._compile(data)
            self.compile_seconds = time.perf_counter() - began
            if reason is not None and runtime == "compiled":
                raise BundleError(f"{source}: runtime compiled: {reason}")
            self.runtime = f"onnxruntime ({reason})" if reason else "compiled"
        for _ in range(warmup):
            self.action(self.act(self._obs)[0])

    def _check_sidecar(self, meta: dict, source: str) -> None:
        """The `<file>.json` sidecar, when there is one, must say what the embedded metadata says: whoever
        reads the sidecar (a person, a dashboard, a script) would otherwise trust numbers the robot does
        not run."""
        sidecar = self.path.with_name(self.path.name + ".json")
        if not sidecar.is_file():
            return
        try:
            document = json.loads(sidecar.read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
            raise BundleError(f"{sidecar}: the bundle's sidecar is not readable JSON ({err})") from err
        found = first_difference(document, meta, "metadata")
        if found is not None:
            raise BundleError(
                f"{sidecar}: the sidecar disagrees with the metadata embedded in {source}: {found}; re-export the "
                "bundle, or remove the sidecar"
            )

    def _check_io(self, meta: dict, source: str) -> None:
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        has_cost = cost_from_metadata(meta, source) is not None
        expected = ["actions", "cost_q"] if has_cost else ["actions"]
        if [i.name for i in inputs] != ["obs"] or [o.name for o in outputs] != expected:
            raise BundleError(
                f"{source}: graph I/O: expected input 'obs' and outputs {expected} "
                f"(metadata.cost_critic {'present' if has_cost else 'absent'}), "
                f"got {[i.name for i in inputs]} -> {[o.name for o in outputs]}"
            )
        obs_dim, act_dim = meta["observation"]["dim"], meta["action"]["dim"]
        shape = inputs[0].shape
        if len(shape) != 2 or shape[1] != obs_dim:
            raise BundleError(
                f"{source}: graph obs shape {shape} disagrees with metadata (expected [batch, {obs_dim}])"
            )
        if has_cost and outputs[1].type not in FLOAT_TENSORS:
            raise BundleError(
                f"{source}: graph I/O types: expected cost_q tensor(float or double), got {outputs[1].type}"
            )
        if inputs[0].type != "tensor(float)" or outputs[0].type not in FLOAT_TENSORS:
            raise BundleError(
                f"{source}: graph I/O types: expected obs tensor(float) and actions tensor(float or double), "
                f"got {inputs[0].type} -> {outputs[0].type}"
            )
        chunk = chunk_from_metadata(meta, source).size
        rows = (chunk,) if chunk > 1 else ()
        # Exporters may leave the output width symbolic; probe runs settle it.
        for batch in (1, 2):
            try:
                probe, *cost = self.session.run(None, {"obs": np.zeros((batch, obs_dim), dtype=np.float32)})
            except Exception as err:
                raise BundleError(f"{source}: graph fails on a batch of {batch} zero observations: {err}") from err
            if cost and (not isinstance(cost[0], np.ndarray) or cost[0].shape != (batch,)):
                shape = list(cost[0].shape) if isinstance(cost[0], np.ndarray) else type(cost[0]).__name__
                raise BundleError(f"{source}: graph cost_q shape {shape} for a batch of {batch}, expected [{batch}]")
            if not isinstance(probe, np.ndarray) or probe.shape != (batch, *rows, act_dim):
                shape = list(probe.shape) if isinstance(probe, np.ndarray) else type(probe).__name__
                raise BundleError(
                    f"{source}: graph actions shape {shape} for a batch of {batch} disagrees "
                    f"with metadata (expected {[batch, *rows, act_dim]})"
                )

    def _bind(self, meta: dict) -> None:
        """Preallocated input and outputs bound to the session (ONNX Runtime I/O binding) for `act`: a
        tick's policy call then allocates nothing and skips the name lookups of `session.run`."""
        chunk = chunk_from_metadata(meta, str(self.path)).size
        rows = (chunk,) if chunk > 1 else ()
        self._obs = np.zeros((1, self.info.obs_dim), dtype=np.float32)
        self._binding = self.session.io_binding()
        self._binding.bind_cpu_input("obs", self._obs)
        self._outputs = []
        for output, shape in zip(self.session.get_outputs(), [(1, *rows, self.info.action_dim), (1,)], strict=False):
            buffer = np.zeros(shape, dtype=np.float64 if output.type == "tensor(double)" else np.float32)
            self._binding.bind_output(output.name, "cpu", 0, buffer.dtype, list(shape), buffer.ctypes.data)
            self._outputs.append(buffer)

    def _compile(self, data: bytes) -> str | None:
        """Lower and compile the graph for `act`, then check it against ONNX Runtime on observations
        from zero to far outside any training range; why not, or None when it is in use."""
        try:
            compiled = CompiledPolicy(onnx.load_from_string(data), self.info.obs_dim, self._outputs)
        except NotLowered as err:
            return str(err)
        rng = np.random.default_rng(0)
        scales = np.logspace(-2, 3, VERIFY_ROWS, dtype=np.float32)[:, None]
        obs = (rng.standard_normal((VERIFY_ROWS, self.info.obs_dim)) * scales).astype(np.float32)
        obs[0] = 0.0
        expected = [np.asarray(out) for out in self.session.run(None, {"obs": obs})]
        for row in range(VERIFY_ROWS):
            compiled(obs[row : row + 1])
            for got, want in zip(self._outputs, expected, strict=True):
                want = want[row : row + 1]
                tolerance = 1e-4 * max(1.0, float(np.nanmax(np.abs(want), initial=0.0)))
                if not np.allclose(got, want, rtol=1e-4, atol=tolerance, equal_nan=True):
                    worst = float(np.nanmax(np.abs(got - want)))
                    return f"the compiled graph differs from ONNX Runtime by {worst:.3g} on a test observation"
        self._compiled = compiled
        return None

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Commands for one (1, obs_dim) observation, and the cost critic's Q_c (1,) if the bundle has
        one, through the bound buffers. The arrays returned are overwritten by the next call."""
        np.copyto(self._obs, obs, casting="same_kind")
        if self._compiled is not None:
            self._compiled(self._obs)
        else:
            self.session.run_with_iobinding(self._binding)
        return self._outputs[0], (self._outputs[1] if len(self._outputs) > 1 else None)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Joint commands for a (batch, obs_dim) float32 array of raw observations (a chunk of them per
        observation for a chunk policy)."""
        obs = np.asarray(obs, dtype=np.float32)
        if obs.ndim != 2 or obs.shape[1] != self.info.obs_dim:
            raise ValueError(f"obs: expected shape (batch, {self.info.obs_dim}), got {obs.shape}")
        return np.asarray(self.session.run(["actions"], {"obs": obs})[0])

    def with_cost(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Joint commands and the cost critic's Q_c of the policy's action, (batch,), from one run."""
        obs = np.asarray(obs, dtype=np.float32)
        if obs.ndim != 2 or obs.shape[1] != self.info.obs_dim:
            raise ValueError(f"obs: expected shape (batch, {self.info.obs_dim}), got {obs.shape}")
        if self.info.cost_critic is None:
            raise BundleError(f"{self.path}: the bundle has no cost critic (metadata.cost_critic)")
        actions, cost = self.session.run(None, {"obs": obs})
        return np.asarray(actions), np.asarray(cost)

    def action(self, commands: np.ndarray) -> tuple[np.ndarray, bool]:
        """One observation's commands (`act`'s first output) back in the policy's [-1, 1] action space,
        float64, flat (a chunk's rows one after another), and whether all of it is finite."""
        return action_from_commands(commands.reshape(-1), self._offset, self._safe_scale, self._scaled)

    def normalized(self, commands: np.ndarray) -> np.ndarray:
        """Back from joint commands to the policy's [-1, 1] action space (for evaluating in sim)."""
        return (commands - self._offset) / self._safe_scale * self._scaled


def first_difference(sidecar: Any, embedded: Any, path: str) -> str | None:
    """Where two JSON documents first differ, as `path.key[i]: sidecar X vs embedded Y`; None if equal.
    Keys are visited in the embedded document's order, then those only the sidecar has."""
    if isinstance(sidecar, dict) and isinstance(embedded, dict):
        for key in [*embedded, *(k for k in sidecar if k not in embedded)]:
            if key not in sidecar or key not in embedded:
                mine = brief(sidecar[key]) if key in sidecar else "(missing)"
                theirs = brief(embedded[key]) if key in embedded else "(missing)"
                return f"{path}.{key}: sidecar {mine} vs embedded {theirs}"
            found = first_difference(sidecar[key], embedded[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(sidecar, list) and isinstance(embedded, list):
        for i, (mine, theirs) in enumerate(zip(sidecar, embedded, strict=False)):
            found = first_difference(mine, theirs, f"{path}[{i}]")
            if found is not None:
                return found
        if len(sidecar) != len(embedded):
            return f"{path}: sidecar {len(sidecar)} entries vs embedded {len(embedded)}"
        return None
    if sidecar != embedded or isinstance(sidecar, bool) != isinstance(embedded, bool):  # JSON true is not 1
        return f"{path}: sidecar {brief(sidecar)} vs embedded {brief(embedded)}"
    return None
