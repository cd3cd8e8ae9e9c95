"""The policy bundle's schema: the metadata document an exported ONNX policy carries, written by
export and read on the robot.

Torch-free and onnxruntime-free on purpose: training code imports it to write a bundle, the robot
imports it to refuse a bad one, and neither side's heavy runtime should be needed by the other. The
document names the robot (validated by exactly the rules a spec file passes), the observation
layout, the action mapping, the control period and where the policy came from.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from q2real.configs.errors import Q2RealError
from q2real.contracts.chunks import ChunkSpec
from q2real.hardware.spec import RobotSpec, SpecError, build_spec

SCHEMA_VERSION = 1
METADATA_KEY = "q2real"
DIGEST_KEY = "q2real.sha256"
"""The ONNX metadata_props entry holding the sha256 of every other byte of the bundle (`seal`)."""
_METADATA_PROPS = 14
"""`ModelProto.metadata_props`: repeated key/value entries, each its own top-level record."""
_ROBOT_ARRAYS = {
    "name": "joint_names",
    "position_limits": "position_limits",
    "velocity_limit": "velocity_limits",
    "effort_limit": "effort_limits",
    "default_position": "default_pose",
    "kp": "kp",
    "kd": "kd",
    "stop_deceleration": "stop_decelerations",
}
"""JointSpec field -> the per-joint list in a bundle's robot section that holds it."""


FIELDS: dict[str, str] = {
    "schema_version": f"int, {SCHEMA_VERSION}: the layout of this document; a node refuses any other version.",
    "task": "The q2real task the policy was trained on; the sim robot rebuilds that task's world from it.",
    "robot": "The robot the policy was trained for, the only robot facts the node reads (null: a gym adapter's "
    "env, which no robot runs).",
    "robot.name": "The robot spec's name (`hardware/`): the node checks the bundle against this machine's spec of "
    "that name and refuses it where they differ (`allow_robot_mismatch=true`: runs with the tighter of both).",
    "robot.sha256": "Digest of the robot spec and model files the policy trained with (64 lowercase hex digits); "
    "a different one on this machine is a difference like any other.",
    "robot.control_mode": '"position" (PD targets) or "torque" (efforts).',
    "robot.joint_names": "The joints in action order, one per action dimension; joint states are matched by name.",
    "robot.default_pose": "rad (or m): where a start ramps to and a reset holds.",
    "robot.position_limits": "[lower, upper] per joint (null: unbounded); the shield's hard limits.",
    "robot.velocity_limits": "rad/s per joint: the shield's rate window per tick is this times the control period.",
    "robot.effort_limits": "N·m (or N) per joint: a torque command's clamp, and the bound on a PD target's torque.",
    "robot.kp": "PD stiffness per joint the policy trained with (position control).",
    "robot.kd": "PD damping per joint.",
    "robot.stop_decelerations": "rad/s² per joint that a stop may take to bring the commanded motion to rest "
    "(null or absent: at once); refused when a joint would take longer than 1 s from its velocity limit.",
    "robot.imu": "The IMU's site and mounting rotation (null: no IMU); the IMU observation terms need it.",
    "robot.imu.site": "The MuJoCo site the IMU sits at.",
    "robot.imu.rotation": "Quaternion (w, x, y, z) from the IMU's frame to the base's.",
    "control_period": "Seconds per tick (> 0): the node ticks at this period.",
    "observation": "What the graph's `obs` input holds, term by term, so the node can build it from ROS inputs.",
    "observation.dim": "Length of one observation (>= 1); the terms' dims sum to it.",
    "observation.terms": "The observation's terms in order; their dims sum to `observation.dim`.",
    "observation.terms[]": "One term: a slice of the observation.",
    "observation.terms[].name": "The task's name for the term (`joint_position`, `command`, ...).",
    "observation.terms[].dim": "Its length (>= 1).",
    "observation.terms[].source": "Where the node reads it on the robot: `{kind, ...}` (see the source kinds "
    "below); a kind the node does not know, or an unknown key, is refused.",
    "observation.normalization": "The observation normalizer, baked into the graph.",
    "observation.normalization.baked_in": "true: the graph normalizes its input; the node feeds raw values.",
    "observation.normalization.clip": "The normalized observation's clip (informational: it is in the graph).",
    "action": "How the graph's output maps to the robot's commands.",
    "action.dim": "Joints commanded (>= 1), one per `robot.joint_names` entry.",
    "action.clip": "[-1, 1]: the policy's normalized action range.",
    "action.scale": "Per joint, >= 0: command = offset + scale * action.",
    "action.offset": "Per joint: the command at action 0; it must lie within the joint's position (or effort) limits.",
    "action.output": "The mapping in words, for a reader.",
    "action.step": "Per joint, in [0, 2]: a stepping policy's largest change of its action per tick (absent: "
    "the policy outputs absolute actions).",
    "action.step_range": "[low, high] per joint, -1 <= low <= high <= 1: where a stepping policy's action may go.",
    "io": "The ONNX graph's inputs and outputs, checked against the graph when the bundle loads.",
    "io.input": "The graph's one input.",
    "io.input.name": '"obs".',
    "io.input.shape": '["batch", observation.dim].',
    "io.output": "The graph's action output.",
    "io.output.name": '"actions": commands in the robot\'s units (scale and offset are inside the graph).',
    "io.output.shape": '["batch", action.dim], or ["batch", chunk.size, action.dim] for a chunk policy.',
    "io.cost_output": "A constrained policy's second output, its cost critic's value of the action.",
    "io.cost_output.name": '"cost_q".',
    "io.cost_output.shape": '["batch"].',
    "chunk": "An action-chunk policy (absent: one action per query): how its chunks are executed.",
    "chunk.size": "Actions per chunk.",
    "chunk.execute": "Actions executed from each chunk before the next query (receding horizon).",
    "chunk.ensemble": "Temporal-ensembling weight across overlapping chunks (null: none).",
    "chunk.dt": "Seconds per action; must equal `control_period`.",
    "cost_critic": "A constrained (safe RL) policy's cost critic, for the node's veto of over-budget actions.",
    "cost_critic.output": '"cost_q".',
    "cost_critic.cost_limit": "The episode cost budget it was trained under (>= 0).",
    "cost_critic.value_limit": "The critic value above which the node vetoes an action (>= 0).",
    "cost_critic.gamma": "The cost critic's discount, in (0, 1].",
    "figures": "The task's live figures on the console and /diagnostics: `fall_tilt` (rad), `within` (m), `point` "
    "(a body point whose distance to the target is shown).",
    "training": "Where the policy came from (informational): the node shows nothing of it and acts on none of it.",
    "training.algo": "The learner (`sac`, `crossq`, ..., `residual`, `bc`).",
    "training.env_steps": "Env steps trained.",
    "training.config": "The run's whole resolved config, as `config.yaml` holds it.",
    "training.residual": "A residual policy's base and demonstrations.",
    "training.residual.scale": "The residual's bound in action units.",
    "training.residual.base": "The BC base's run directory and checkpoint digest.",
    "training.residual.demos": "The demonstrations the residual mixed into its batches.",
    "git_sha": "The q2real commit that exported it.",
    "exported_at": "When it was exported (ISO 8601).",
    "opset": "The ONNX opset of the graph.",
}
"""Every field a bundle's metadata may carry (list items as `[]`): what it means and what the node checks.
The bundle reference is generated from this table, and a test fails when an exported bundle carries a
field it does not list."""


class BundleError(Q2RealError, ValueError):
    """A bundle is unreadable, malformed, from another schema version, or disagrees with itself."""


_BRIEF = reprlib.Repr()
_BRIEF.maxlist = _BRIEF.maxdict = _BRIEF.maxtuple = 8
_BRIEF.maxstring = _BRIEF.maxother = 80


def brief(value: Any) -> str:
    """A bounded repr for error messages: a hostile field must not become a megabyte of log."""
    return _BRIEF.repr(value)


def _finite(value: Any) -> bool:
    """A finite JSON number; an integer too large for a float (JSON allows any digits) is not."""
    try:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        return False


def _get(data: dict, path: str, kind, source: str) -> Any:
    node: Any = data
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise BundleError(f"{source}: metadata.{path}: missing")
        node = node[key]
    if kind is float:
        ok = _finite(node)
    elif kind is int:
        ok = isinstance(node, int) and not isinstance(node, bool)
    else:
        ok = isinstance(node, kind)
    if not ok:
        raise BundleError(f"{source}: metadata.{path}: expected {getattr(kind, '__name__', kind)}, got {brief(node)}")
    return node


def _numbers(data: dict, path: str, length: int, source: str) -> list[float]:
    values = _get(data, path, list, source)
    if len(values) != length or not all(map(_finite, values)):
        raise BundleError(f"{source}: metadata.{path}: expected {length} finite numbers, got {brief(values)}")
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
        if _get(term, "dim", int, f"{source}: observation.terms[{i}]") < 1:
            raise BundleError(f"{source}: metadata.observation.terms[{i}].dim: expected >= 1, got {term['dim']}")
    if sum(t["dim"] for t in terms) != obs_dim:
        raise BundleError(
            f"{source}: metadata.observation.terms: dims sum to {sum(t['dim'] for t in terms)}, not {obs_dim}"
        )
    scale = _numbers(meta, "action.scale", act_dim, source)
    if min(scale) < 0:
        raise BundleError(f"{source}: metadata.action.scale: expected numbers >= 0, got {brief(scale)}")
    offset = _numbers(meta, "action.offset", act_dim, source)
    if "step" in meta["action"] or "step_range" in meta["action"]:  # the graph's own; said for the reader
        _check_steps(meta, act_dim, source)
    if _get(meta, "control_period", float, source) <= 0:
        raise BundleError(f"{source}: metadata.control_period: expected > 0")
    if meta.get("robot") is not None:
        robot = robot_from_metadata(meta, source)
        _check_action_range(robot, scale, offset, source)
    chunk = chunk_from_metadata(meta, source)
    if cost_from_metadata(meta, source) is not None and chunk.size > 1:
        raise BundleError(f"{source}: metadata.cost_critic: a cost critic prices single actions, not chunks")


def _check_steps(meta: dict, act_dim: int, source: str) -> None:
    step = _numbers(meta, "action.step", act_dim, source)
    if not all(0 <= v <= 2 for v in step):
        raise BundleError(f"{source}: metadata.action.step: expected numbers in [0, 2], got {brief(step)}")
    bounds = _get(meta, "action.step_range", list, source)
    if len(bounds) != 2:
        raise BundleError(f"{source}: metadata.action.step_range: expected [low, high], got {brief(bounds)}")
    for k, side in enumerate(bounds):
        if not isinstance(side, list) or len(side) != act_dim or not all(map(_finite, side)):
            raise BundleError(
                f"{source}: metadata.action.step_range[{k}]: expected {act_dim} finite numbers, got {brief(side)}"
            )
    low, high = bounds
    if not all(-1 <= lo <= hi <= 1 for lo, hi in zip(low, high, strict=True)):
        raise BundleError(
            f"{source}: metadata.action.step_range: expected -1 <= low <= high <= 1 per joint, got {brief(bounds)}"
        )


def cost_from_metadata(meta: dict[str, Any], source: str) -> dict[str, Any] | None:
    """The bundle's cost critic section (absent: no `cost_q` output), refused with the field named: its
    numbers decide which commands the node's veto lets through."""
    section = meta.get("cost_critic")
    if section is None:
        return None
    if not isinstance(section, dict):
        raise BundleError(f"{source}: metadata.cost_critic: expected an object, got {brief(section)}")
    if section.get("output") != "cost_q":
        raise BundleError(
            f"{source}: metadata.cost_critic.output: expected 'cost_q', got {brief(section.get('output'))}"
        )
    for key in ("cost_limit", "value_limit"):
        if _get(meta, f"cost_critic.{key}", float, source) < 0:
            raise BundleError(f"{source}: metadata.cost_critic.{key}: expected >= 0, got {brief(section[key])}")
    if not 0 < _get(meta, "cost_critic.gamma", float, source) <= 1:
        raise BundleError(f"{source}: metadata.cost_critic.gamma: expected in (0, 1], got {brief(section['gamma'])}")
    return section


def chunk_from_metadata(meta: dict[str, Any], source: str) -> ChunkSpec:
    """The bundle's chunk section (absent: one action per query), refused with the field named: every
    number in it decides which action reaches the shield on which tick."""
    section = meta.get("chunk")
    if section is None:
        return ChunkSpec()
    keys = {"size", "execute", "ensemble", "dt"}
    if not isinstance(section, dict) or set(section) != keys:
        found = sorted(section) if isinstance(section, dict) else brief(section)
        raise BundleError(f"{source}: metadata.chunk: expected an object with keys {sorted(keys)}, got {found}")
    for key in ("size", "execute"):
        _get(meta, f"chunk.{key}", int, source)
    if section["ensemble"] is not None:
        _get(meta, "chunk.ensemble", float, source)
    spec = ChunkSpec(section["size"], section["execute"], section["ensemble"])
    for key, expected in spec.problems():
        raise BundleError(f"{source}: metadata.chunk.{key}: expected {expected}, got {brief(section[key])}")
    if _get(meta, "chunk.dt", float, source) != meta["control_period"]:
        raise BundleError(
            f"{source}: metadata.chunk.dt: expected the control period {meta['control_period']} "
            f"(one action per tick), got {brief(section['dt'])}"
        )
    return spec


def robot_from_metadata(meta: dict, source: str, control_period: float | None = None) -> RobotSpec:
    """The robot as the bundle describes it, validated by the same rules as a spec file.

    The node reads nothing else about the robot. The bundle carries no MJCF, so `model_path` is the
    bundle itself and shield features that need the model (workspace forward kinematics) are
    unavailable on the node.
    """
    robot = meta.get("robot")
    if not isinstance(robot, dict):
        raise BundleError(f"{source}: metadata.robot: missing; the node needs the robot's joints and limits")
    act_dim = _get(meta, "action.dim", int, source)
    names = _get(meta, "robot.joint_names", list, source)
    if len(names) != act_dim:
        raise BundleError(f"{source}: metadata.robot.joint_names: expected {act_dim} names, got {brief(names)}")
    columns = {"joint_names": names}
    for key in ("default_pose", "velocity_limits", "effort_limits", "kp", "kd"):
        columns[key] = _numbers(meta, f"robot.{key}", act_dim, source)
    limits = _get(meta, "robot.position_limits", list, source)
    bound = lambda v: v is None or _finite(v)  # noqa: E731
    if len(limits) != act_dim or not all(isinstance(p, list) and len(p) == 2 and all(map(bound, p)) for p in limits):
        raise BundleError(
            f"{source}: metadata.robot.position_limits: expected {act_dim} [lower, upper] pairs "
            "(numbers, or null for an unbounded side)"
        )
    columns["position_limits"] = [
        (-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi)) for lo, hi in limits
    ]
    columns["stop_decelerations"] = _stop_decelerations(robot, act_dim, source)
    joints = [{field: columns[key][i] for field, key in _ROBOT_ARRAYS.items()} for i in range(act_dim)]
    digest = _get(meta, "robot.sha256", str, source)
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise BundleError(f"{source}: metadata.robot.sha256: expected 64 lowercase hex digits, got {brief(digest)}")

    def locate(key: str, i: int | None, joint: str) -> str:
        if i is None:
            path = {"control_period": "control_period", "joints": "robot.joint_names"}.get(key, f"robot.{key}")
            return f"{source}: metadata.{path}"
        return f"{source}: metadata.robot.{_ROBOT_ARRAYS.get(key, key)}[{i}]" + (
            f" (joint {joint!r})" if key != "name" else ""
        )

    try:
        return build_spec(
            robot.get("name"),
            robot.get("control_mode"),
            meta["control_period"] if control_period is None else control_period,
            joints,
            locate,
            Path(source),
            Path(source),
            robot.get("imu"),
        )
    except SpecError as err:
        raise BundleError(str(err)) from err


def _stop_decelerations(robot: dict, act_dim: int, source: str) -> list[float]:
    """Per joint, null (or a bundle written before stops had a deceleration) means at once."""
    values = robot.get("stop_decelerations")
    if values is None:
        return [math.inf] * act_dim
    if not isinstance(values, list) or len(values) != act_dim or not all(v is None or _finite(v) for v in values):
        raise BundleError(
            f"{source}: metadata.robot.stop_decelerations: expected {act_dim} entries, each a number or null "
            f"(stop at once), got {brief(values)}"
        )
    return [math.inf if v is None else float(v) for v in values]


def _check_action_range(robot: RobotSpec, scale: list[float], offset: list[float], source: str) -> None:
    """The action mapping's centre must be a command the robot may receive."""
    for i, joint in enumerate(robot.joints):
        lo, hi = (-joint.effort_limit, joint.effort_limit) if robot.control_mode == "torque" else joint.position_limits
        if not lo <= offset[i] <= hi:
            raise BundleError(
                f"{source}: metadata.action.offset[{i}] (joint {joint.name!r}): {offset[i]} lies outside "
                f"[{lo}, {hi}] ({'effort' if robot.control_mode == 'torque' else 'position'} limits)"
            )


def parse_metadata(raw: str, source: str) -> dict[str, Any]:
    """The metadata document, validated; a refusal names the bundle and the field."""
    try:
        meta = json.loads(raw)  # NaN and Infinity parse; the field checks then name where they are
    except (ValueError, RecursionError) as err:
        raise BundleError(f"{source}: metadata: not valid JSON ({err})") from err
    validate_metadata(meta, source)
    return meta


@dataclass(frozen=True)
class BundleInfo:
    obs_dim: int
    action_dim: int
    control_period: float
    joint_names: tuple[str, ...] | None
    metadata: dict[str, Any]
    chunk: ChunkSpec
    """How the policy's actions are executed (size 1: one per query, the graph outputs (batch, action_dim))."""
    cost_critic: dict[str, Any] | None
    """The cost critic behind the graph's `cost_q` output (None: the graph has none)."""

    @classmethod
    def of(cls, meta: dict[str, Any]) -> BundleInfo:
        """The headline facts of a validated metadata document (`parse_metadata`)."""
        robot = meta.get("robot")
        return cls(
            obs_dim=meta["observation"]["dim"],
            action_dim=meta["action"]["dim"],
            control_period=float(meta["control_period"]),
            joint_names=tuple(robot["joint_names"]) if robot else None,
            metadata=meta,
            chunk=chunk_from_metadata(meta, "metadata"),
            cost_critic=cost_from_metadata(meta, "metadata"),
        )


def robot_metadata(spec: RobotSpec) -> dict[str, Any]:
    """The bundle's robot section for `spec`, the inverse of `robot_from_metadata`; every number at full
    precision (JSON floats are float64), an unbounded joint limit as null (JSON has no infinity)."""
    return {
        "name": spec.name,
        "sha256": spec.sha256,
        "control_mode": spec.control_mode,
        "joint_names": spec.joint_names,
        "default_pose": spec.array("default_position").tolist(),
        "position_limits": [
            [x if math.isfinite(x) else None for x in pair] for pair in spec.array("position_limits").tolist()
        ],
        "velocity_limits": spec.array("velocity_limit").tolist(),
        "effort_limits": spec.array("effort_limit").tolist(),
        "kp": spec.array("kp").tolist(),
        "kd": spec.array("kd").tolist(),
        "stop_decelerations": [x if math.isfinite(x) else None for x in spec.array("stop_deceleration").tolist()],
        "imu": {"site": spec.imu.site, "rotation": list(spec.imu.rotation)} if spec.imu else None,
    }


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The bundle's metadata from the ONNX file itself (validated), without creating a session."""
    import onnx  # the ONNX protobuf reader only; no runtime

    source = str(path)
    try:
        model = onnx.load(source, load_external_data=False)
    except Exception as err:
        raise BundleError(f"{source}: not an ONNX file: {err}") from err
    entries = {p.key: p.value for p in model.metadata_props}
    if METADATA_KEY not in entries:
        raise BundleError(f"{source}: metadata: no '{METADATA_KEY}' entry in the ONNX metadata_props")
    return parse_metadata(entries[METADATA_KEY], source)


def seal(path: str | Path) -> None:
    """Append the bundle's digest to the ONNX file at `path` (replacing any earlier one): the sha256 of
    all its other bytes, as a `q2real.sha256` metadata_props entry. A flipped byte in a weight loads
    and runs and a changed digit in the metadata may still validate; only the digest tells either
    from what was exported. Protobuf merges a repeated field's records wherever they lie, so the entry
    is appended without re-serializing the model."""
    path = Path(path)
    data = path.read_bytes()
    records = _records(data, str(path))
    kept = b"".join(bytes(record) for record, is_digest in records if not is_digest)
    entry = _field(1, DIGEST_KEY.encode()) + _field(2, _digest(records).encode())
    tmp = path.with_name(f".{path.name}.seal")
    tmp.write_bytes(kept + _field(_METADATA_PROPS, entry))
    os.replace(tmp, path)


def check_seal(data: bytes, source: str) -> None:
    """Refuse an ONNX file (`data`, its bytes) whose digest is missing or does not match the rest."""
    records = _records(data, source)
    digests = [bytes(record) for record, is_digest in records if is_digest]
    if len(digests) != 1:
        raise BundleError(
            f"{source}: {len(digests)} '{DIGEST_KEY}' entries, expected one: exported before bundles carried "
            "a digest, or edited by another tool; export it again"
        )
    recorded = digests[0][-64:].decode("ascii", errors="replace")
    actual = _digest(records)
    if recorded != actual:
        raise BundleError(
            f"{source}: its bytes hash to sha256 {actual[:16]}..., the bundle records {recorded[:16]}...: the "
            "file was damaged or edited after export; export it again"
        )


def _digest(records: list[tuple[memoryview, bool]]) -> str:
    """The hex sha256 of every record but the digest entry, in file order."""
    digest = hashlib.sha256()
    for record, is_digest in records:
        if not is_digest:
            digest.update(record)
    return digest.hexdigest()


def _records(data: bytes, source: str) -> list[tuple[memoryview, bool]]:
    """The file's top-level protobuf records in order, each with whether it is the digest entry."""
    view, at, records = memoryview(data), 0, []
    marker = _field(1, DIGEST_KEY.encode())
    while at < len(view):
        start, payload = at, view[:0]
        key, at = _varint(view, at, source)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, at = _varint(view, at, source)
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        elif wire == 2:
            size, at = _varint(view, at, source)
            payload, at = view[at : at + size], at + size
        else:
            raise BundleError(f"{source}: not an ONNX model: protobuf wire type {wire} at byte {start}")
        if at > len(view):
            raise BundleError(f"{source}: not an ONNX model: a record at byte {start} runs past the end")
        is_digest = field == _METADATA_PROPS and wire == 2 and bytes(payload[: len(marker)]) == marker
        records.append((view[start:at], is_digest))
    return records


def _varint(view: memoryview, at: int, source: str) -> tuple[int, int]:
    value = shift = 0
    while at < len(view) and shift < 64:
        byte = view[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at
    raise BundleError(f"{source}: not an ONNX model: a malformed length at byte {at}")


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf record: tag, length, payload."""
    out, value = bytearray(), len(payload)
    for part in ((number << 3) | 2, value):
        while part >= 0x80:
            out.append(part & 0x7F | 0x80)
            part >>= 7
        out.append(part)
    return bytes(out) + payload
