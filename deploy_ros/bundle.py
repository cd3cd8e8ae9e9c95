"""Policy bundles: one ONNX file that carries its policy and everything a robot needs to run it.

The graph maps raw observations (`obs`, shape (batch, obs_dim)) to joint commands in the robot's
units (`actions`, shape (batch, action_dim)); observation normalization and action scaling are inside
it. One JSON document under the `q2real` metadata key (and in an identical `<file>.json` sidecar)
describes the robot, the observation layout, the action mapping, the control period and where the
policy came from. This module needs numpy and onnxruntime only: it is what runs on the robot.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

SCHEMA_VERSION = 1
METADATA_KEY = "q2real"


class BundleError(ValueError):
    """A bundle is unreadable, malformed, from another schema version, or disagrees with itself."""


def _get(data: dict, path: str, kind, source: str) -> Any:
    node: Any = data
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise BundleError(f"{source}: metadata.{path}: missing")
        node = node[key]
    if kind is float:
        ok = isinstance(node, int | float) and not isinstance(node, bool) and math.isfinite(node)
    elif kind is int:
        ok = isinstance(node, int) and not isinstance(node, bool)
    else:
        ok = isinstance(node, kind)
    if not ok:
        raise BundleError(f"{source}: metadata.{path}: expected {getattr(kind, '__name__', kind)}, got {node!r}")
    return node


def _numbers(data: dict, path: str, length: int, source: str) -> list[float]:
    values = _get(data, path, list, source)
    if len(values) != length or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values
    ):
        raise BundleError(f"{source}: metadata.{path}: expected {length} finite numbers, got {values!r}")
    return [float(v) for v in values]


def validate_metadata(meta: Any, source: str) -> None:
    """Raise BundleError naming the first field that is missing, mistyped or inconsistent."""
    if not isinstance(meta, dict):
        raise BundleError(f"{source}: metadata: expected a JSON object")
    version = _get(meta, "schema_version", int, source)
    if version != SCHEMA_VERSION:
        raise BundleError(f"{source}: metadata.schema_version: {version}, this q2real reads {SCHEMA_VERSION}")
    obs_dim = _get(meta, "observation.dim", int, source)
    act_dim = _get(meta, "action.dim", int, source)
    if obs_dim < 1 or act_dim < 1:
        raise BundleError(f"{source}: metadata.observation.dim/action.dim: expected >= 1")
    terms = _get(meta, "observation.terms", list, source)
    for i, term in enumerate(terms):
        _get(term if isinstance(term, dict) else {}, "name", str, f"{source}: observation.terms[{i}]")
        _get(term if isinstance(term, dict) else {}, "dim", int, f"{source}: observation.terms[{i}]")
    if sum(t["dim"] for t in terms) != obs_dim:
        raise BundleError(
            f"{source}: metadata.observation.terms: dims sum to {sum(t['dim'] for t in terms)}, not {obs_dim}"
        )
    _numbers(meta, "action.scale", act_dim, source)
    _numbers(meta, "action.offset", act_dim, source)
    if _get(meta, "control_period", float, source) <= 0:
        raise BundleError(f"{source}: metadata.control_period: expected > 0")
    robot = meta.get("robot")
    if robot is not None:
        names = _get(meta, "robot.joint_names", list, source)
        if len(names) != act_dim or not all(isinstance(n, str) for n in names):
            raise BundleError(f"{source}: metadata.robot.joint_names: expected {act_dim} names, got {names!r}")
        for key in ("default_pose", "velocity_limits", "effort_limits", "kp", "kd"):
            _numbers(meta, f"robot.{key}", act_dim, source)
        limits = _get(meta, "robot.position_limits", list, source)
        bound = lambda v: v is None or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v))  # noqa: E731
        if len(limits) != act_dim or not all(
            isinstance(p, list) and len(p) == 2 and all(map(bound, p)) for p in limits
        ):
            raise BundleError(
                f"{source}: metadata.robot.position_limits: expected {act_dim} [lower, upper] pairs "
                "(numbers, or null for an unbounded side)"
            )
        _get(meta, "robot.name", str, source)
        _get(meta, "robot.sha256", str, source)
        _get(meta, "robot.control_mode", str, source)


@dataclass(frozen=True)
class BundleInfo:
    obs_dim: int
    action_dim: int
    control_period: float
    joint_names: tuple[str, ...] | None
    metadata: dict[str, Any]


class PolicyBundle:
    """An ONNX policy ready to run: validated, single-threaded, sequential, no spinning, warmed up."""

    def __init__(self, path: str | Path, warmup: int = 20):
        self.path = Path(path)
        source = str(self.path)
        if not self.path.is_file():
            raise BundleError(f"{source}: no such bundle file")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        except Exception as err:
            raise BundleError(f"{source}: onnxruntime cannot load it: {err}") from err
        raw = self.session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
        if raw is None:
            raise BundleError(f"{source}: metadata: no '{METADATA_KEY}' entry in the ONNX metadata_props")
        try:
            meta = json.loads(raw)
        except json.JSONDecodeError as err:
            raise BundleError(f"{source}: metadata: not valid JSON ({err})") from err
        validate_metadata(meta, source)
        self._check_io(meta, source)
        robot = meta.get("robot")
        self.info = BundleInfo(
            obs_dim=meta["observation"]["dim"],
            action_dim=meta["action"]["dim"],
            control_period=float(meta["control_period"]),
            joint_names=tuple(robot["joint_names"]) if robot else None,
            metadata=meta,
        )
        self._scale = np.asarray(meta["action"]["scale"], dtype=np.float32)
        self._offset = np.asarray(meta["action"]["offset"], dtype=np.float32)
        zeros = np.zeros((1, self.info.obs_dim), dtype=np.float32)
        for _ in range(warmup):
            self(zeros)

    def _check_io(self, meta: dict, source: str) -> None:
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if [i.name for i in inputs] != ["obs"] or [o.name for o in outputs] != ["actions"]:
            raise BundleError(
                f"{source}: graph I/O: expected input 'obs' and output 'actions', "
                f"got {[i.name for i in inputs]} -> {[o.name for o in outputs]}"
            )
        obs_dim, act_dim = meta["observation"]["dim"], meta["action"]["dim"]
        shape = inputs[0].shape
        if len(shape) != 2 or shape[1] != obs_dim:
            raise BundleError(
                f"{source}: graph obs shape {shape} disagrees with metadata (expected [batch, {obs_dim}])"
            )
        # Exporters may leave the output width symbolic; a probe run settles it.
        probe = self.session.run(None, {"obs": np.zeros((2, obs_dim), dtype=np.float32)})[0]
        if probe.shape != (2, act_dim):
            raise BundleError(
                f"{source}: graph actions shape {list(probe.shape)} for a batch of 2 disagrees with metadata "
                f"(expected [2, {act_dim}])"
            )

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Joint commands for a (batch, obs_dim) float32 array of raw observations."""
        obs = np.asarray(obs, dtype=np.float32)
        if obs.ndim != 2 or obs.shape[1] != self.info.obs_dim:
            raise ValueError(f"obs: expected shape (batch, {self.info.obs_dim}), got {obs.shape}")
        return self.session.run(None, {"obs": obs})[0]

    def normalized(self, commands: np.ndarray) -> np.ndarray:
        """Back from joint commands to the policy's [-1, 1] action space (for evaluating in sim)."""
        return (commands - self._offset) / self._scale


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The bundle's metadata from the ONNX file itself (validated), without creating a session."""
    import onnx

    source = str(path)
    try:
        model = onnx.load(source, load_external_data=False)
    except Exception as err:
        raise BundleError(f"{source}: not an ONNX file: {err}") from err
    entries = {p.key: p.value for p in model.metadata_props}
    if METADATA_KEY not in entries:
        raise BundleError(f"{source}: metadata: no '{METADATA_KEY}' entry in the ONNX metadata_props")
    meta = json.loads(entries[METADATA_KEY])
    validate_metadata(meta, source)
    return meta
