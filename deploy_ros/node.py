"""The deployment node's core: joint states in, shielded joint commands out, at the bundle's rate.

Transport-agnostic: the DDS transport (`q2real.deploy_ros.dds`, ROS 2 wire format without a ROS
install) and the rclpy node (`q2real.deploy_ros.rclpy_node`) both feed this class the same inputs
and publish what it returns. Everything the node knows about the robot comes from the bundle.

One tick: take the newest joint state (joints matched by name) and the newest reading of each other
input the bundle reads (base IMU, velocity command, object pose; `q2real.deploy_ros.inputs`, each with
its own age limit) -> observation as the bundle's metadata says -> policy (timed against the deadline)
-> shield -> command in the robot's interface (effort for torque-controlled robots, position targets
otherwise). Messages that could not have come
from the robot the bundle was trained for (wrong lengths, unknown or missing joints, non-finite
positions or velocities) are refused and counted; they never reach the shield or the command topic.

Operator requests (e-stop, reset, start) are queued in arrival order and applied at the next tick,
where an e-stop received since the last tick wins over every reset, start or mode request of that
tick: a reset clears only an e-stop of an earlier tick, and `autostart` never restarts the policy
after an e-stop (a latched stop needs a reset and then an explicit start).

Ticks are triggered by fresh joint states (`trigger: state`, the default: the observation is as young
as the transport allows), one per control period, with the period's timer as the fallback when the
robot goes quiet; `trigger: timer` ticks on the timer alone. A state-triggered tick runs in the
thread that delivered the state, the moment it arrives, so no thread handoff stands between a state
and its command; diagnostics and recording run on their own threads, and every tick stamps where its
time went (`q2real.deploy_ros.timing`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from q2real.contracts.chunks import ChunkQueue
from q2real.contracts.schema import BundleError, brief, robot_from_metadata
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.deploy_ros.inputs import Inputs
from q2real.deploy_ros.observation import ObservationBuilder
from q2real.deploy_ros.realtime import Collector
from q2real.deploy_ros.settings import NodeConfig, local_robot
from q2real.deploy_ros.timing import COLUMN, TickTimes
from q2real.hardware.model import load_model
from q2real.hardware.spec import RobotSpec, SpecError, differences, tighter
from q2real.safety.compiled import Shield
from q2real.safety.flags import Mode, Rule
from q2real.safety.limits import clip
from q2real.safety.shield import Command

REFUSAL_CHARS = 300
"""Longest refusal reason kept for diagnostics: a hostile message must not be republished whole."""


@dataclass(frozen=True)
class JointSample:
    position: np.ndarray
    """In `PolicyNode.joints` order."""
    velocity: np.ndarray
    received: float
    """time.monotonic() when it arrived: freshness is judged on the node's own clock."""


@dataclass
class Tick:
    """What one tick did; the transport publishes `values` and the recorder logs the rest."""

    time: float
    observation: np.ndarray | None
    raw_action: np.ndarray | None
    """This tick's action in [-1, 1] as the policy gave it: its output, or a chunk policy's queued action
    for this tick (None outside RUN)."""
    command: Command
    values: np.ndarray
    """Per bundle joint: effort (torque robots) or position target, as sent."""
    latency: float
    """Seconds from the joint state's arrival to the command being ready (NaN if no new state)."""
    position: np.ndarray | None = None
    """The bundle joints' measured positions this tick used (None without a joint state yet)..."""
    velocity: np.ndarray | None = None
    """...and velocities: with the next tick's, what a learner on the robot computes the reward from."""


Publish = Callable[[Tick], None]
UNUSABLE_STATE = int(Rule.STATE_MISSING | Rule.STATE_NONFINITE | Rule.STATE_OUT_OF_LIMITS | Rule.STATE_STALE)


class PolicyNode:
    """Bundle + observation builder + shield, with the node's inputs and its tick."""

    def __init__(self, bundle: str | Path, config: NodeConfig | None = None):
        self.config = config = config or NodeConfig()
        config.validate()
        self.bundle = PolicyBundle(bundle)
        source = str(bundle)
        meta = self.bundle.info.metadata
        trained = robot_from_metadata(meta, source)
        robot = self._checked_robot(trained, source, meta["robot"]["sha256"])
        self.spec = dataclasses.replace(robot, control_period=config.control_period or trained.control_period)
        self.period = self.spec.control_period
        self.observation = ObservationBuilder(meta, source, functools.partial(load_model, self._local))
        self.inputs = Inputs(self.observation, config.inputs, self.spec.imu, config.topics, source)
        """The IMU, velocity command and object pose streams the policy reads, with their age limits."""
        self.names = self.spec.joint_names
        # Every joint a valid message must carry: the actuated ones and the ones the policy observes.
        self.joints = tuple(self.names) + tuple(j for j in self.observation.joints if j not in self.names)
        self._index = {name: i for i, name in enumerate(self.joints)}
        self._allowed = set(self.joints) | set(config.extra_joints)
        self._spec_rows = np.arange(len(self.names))
        self._obs_rows = np.array([self._index[j] for j in self.observation.joints], dtype=np.intp)
        action = meta["action"]
        # The action mapping is the bundle's; the caller's config is left as it was handed over.
        shield_config = dataclasses.replace(
            config.shield, action_scale=tuple(action["scale"]), action_offset=tuple(action["offset"])
        )
        if shield_config.workspace_points:
            raise BundleError(f"{source}: shield.workspace_points: the bundle carries no MJCF for forward kinematics")
        if config.cost_veto is not None and self.bundle.info.cost_critic is None:
            raise BundleError(f"{source}: cost_veto: the bundle has no cost critic (metadata.cost_critic) to veto with")
        self._cost_q = math.nan
        """The cost critic's value of this tick's policy action (NaN until the policy ran)."""
        veto = self._cost_veto if config.cost_veto is not None else None
        self.shield = Shield(self.spec, shield_config, veto=veto)
        self.torque = self.spec.control_mode == "torque"
        self.interface = "effort" if self.torque else "position"
        """The joints' command interface: an effort controller for torque robots, position otherwise."""
        self._effort_limit = self.spec.array("effort_limit")
        self._latest: JointSample | None = None
        self._layout: tuple[list[str], np.ndarray, np.ndarray] | None = None
        """The last valid message's joint names, the indices it uses and the rows they fill."""
        self._used: JointSample | None = None
        self._state_period = math.inf
        """Smoothed seconds between joint states."""
        self._tick_lock = threading.Lock()
        """Held for a tick and its publishing: a tick on arrival and one on the timer never overlap."""
        self._publish: Publish | None = None
        """Set while `spin` runs: a state arriving then is ticked on in the thread that delivered it."""
        self._next_at = math.inf
        """time.monotonic() the next tick is due; its window opens a quarter period earlier."""
        self._wake = threading.Event()
        """Set by an e-stop and after a tick on arrival: the loop re-arms its wait."""
        self.collector = Collector(config.realtime.gc == "between_ticks")
        self.times = TickTimes()
        self.subscribers: Callable[[], int] | None = None
        """Matched subscribers of the command topic, if the transport can tell (`require_subscriber`)."""
        self.waiting = ""
        """Why a start is being held back (no controller listening), or empty."""
        self.held_back = ""
        """Why the handover to the policy is being held back (an input missing or stale), or empty."""
        self.changed = threading.Event()
        """Set when a tick changed the mode or the shield gave a reason: diagnostics go out at once."""
        self.last_reason = ""
        self._lock = threading.Lock()
        self._requests: list[tuple[str, float, str]] = []
        """Operator requests (kind 'estop', 'reset' or 'start'; time.monotonic() at receipt; reason)
        since the last tick, in arrival order."""
        self._estop_event = threading.Event()
        """Set by an e-stop: wakes the loop out of any wait so the stop is applied at once."""
        self._latched_at = -math.inf
        """time.monotonic() when ESTOP last latched; a reset received before it cannot clear it."""
        self._handover = False
        self._autostart = config.autostart
        """Armed until the first e-stop: after one, only an explicit start runs the policy again."""
        self._task_command = np.zeros(self.observation.command_dim)
        self._last_action = np.zeros(self.bundle.info.action_dim, dtype=np.float32)
        chunk, width = self.bundle.info.chunk, self.bundle.info.action_dim
        self._chunks = ChunkQueue(chunk, 1, width, np) if chunk.size > 1 else None
        """A chunk policy's actions still to come; the policy runs only on the ticks it is due."""
        self._output_shape = (1, *((chunk.size,) if chunk.size > 1 else ()), width)
        self.policy_queries = 0
        """Ticks on which the policy ran (all RUN ticks, or a chunk policy's due ticks)."""
        self.refused: Counter[str] = Counter()
        self.last_refusal = ""
        self.loop_misses = 0
        self.ticks = 0
        self.last_flags = 0
        self.version = 0
        """Which version of the policy runs: 0 the bundle started with, then those swapped in (`swap`)."""
        self.exploration: Callable[[np.ndarray], np.ndarray] | None = None
        """Fine-tuning's bounded noise on the policy's action, before the shield (None: none)."""
        self.on_tick: Publish | None = None
        """Called with every tick after it was published, under the tick lock (fine-tuning's stream)."""

    def _checked_robot(self, trained: RobotSpec, source: str, trained_hash: str) -> RobotSpec:
        """The robot the shield enforces: the bundle's, when it matches this machine's spec; the
        tighter of both when a mismatch is explicitly allowed (every difference logged); otherwise
        the bundle is refused."""
        config = self.config
        try:
            local = local_robot(config, trained)
        except SpecError as err:
            raise BundleError(
                f"{source}: metadata.robot: no spec of robot '{trained.name}' on this machine to check it "
                f"against ({err}); set robot=<name or robot.yaml>"
            ) from err
        self._local = local
        found = differences(trained, local)
        if local.sha256 != trained_hash:
            found.append(f"sha256 (spec + model files): bundle {trained_hash[:12]} vs local {local.sha256[:12]}")
        self.robot_mismatch = found
        if not found:
            return trained
        if not config.allow_robot_mismatch:
            raise BundleError(
                f"{source}: metadata.robot does not match this machine's spec {local.source} (bundle vs local): "
                + "; ".join(found)[:2000]
                + ". Retrain or re-export for this robot, or set allow_robot_mismatch=true to run anyway"
            )
        try:
            robot = tighter(trained, local)
        except SpecError as err:
            raise BundleError(f"{source}: allow_robot_mismatch: {err}") from err
        for line in found:
            print(
                f"warning: {source}: robot mismatch allowed (the shield enforces the tighter limits): {line}",
                file=sys.stderr,
            )
        return robot

    # --- inputs (any thread) ---------------------------------------------------------------------
    def check_robot(self, names: list[str]) -> None:
        """Refuse to run against a robot whose joint states do not match the bundle."""
        missing = [n for n in self.joints if n not in names]
        unknown = [n for n in names if n not in self._allowed]
        if missing or unknown:
            raise BundleError(
                f"{self.bundle.path}: the robot's joint states do not match the bundle's robot "
                f"'{self.spec.name}': missing {brief(missing)}, unknown {brief(unknown)} (robot publishes "
                f"{brief(list(names))}; "
                "list joints the policy does not use in extra_joints)"
            )

    def on_joint_state(self, names, position, velocity, effort, received: float | None = None) -> str | None:
        """Store a joint state message; returns why it was refused, or None."""
        now = time.monotonic()
        # A stamp from the future would make the state look fresh for longer than it is.
        received = now if received is None else min(received, now)
        read = self._read(list(names), position, velocity, effort)
        if isinstance(read, str):
            self._refuse(read)
            return read
        position, velocity = read
        assert self._layout is not None, "a message that was read has set the layout"
        _, used, rows = self._layout
        q = np.full(len(self.joints), np.nan)
        qd = np.full(len(self.joints), np.nan)
        q[rows] = position[used]
        qd[rows] = velocity[used]
        if self._latest is not None:
            gap = received - self._latest.received
            self._state_period = gap if math.isinf(self._state_period) else 0.9 * self._state_period + 0.1 * gap
        self._latest = JointSample(q, qd, received)
        publish = self._publish
        if publish is not None and self._ticks_on_arrival():
            self._take_tick(publish, arrival=True)
        return None

    def _refuse(self, reason: str) -> None:
        self.refused[reason.split(":")[0]] += 1
        self.last_refusal = reason[:REFUSAL_CHARS]

    def _read(self, names: list[str], position, velocity, effort) -> str | tuple[np.ndarray, np.ndarray]:
        """Why the message is refused, or its positions and velocities as arrays (in message order; the
        joint layout in `_layout`). A robot sends the same names every time: they are checked once,
        then only the lengths and the values are checked per message."""
        n = len(names)
        if len(position) != n or len(velocity) != n or len(effort) not in (0, n):
            return (
                f"lengths: {n} names, {len(position)} positions, {len(velocity)} velocities, "
                f"{len(effort)} efforts (positions and velocities must match the names; efforts too or empty)"
            )
        if self._layout is None or names != self._layout[0]:
            if len(set(names)) != n:
                return f"duplicate: joint names repeat in {brief(names)}"
            unknown = [name for name in names if name not in self._allowed]
            if unknown:
                return f"unknown: joints {brief(unknown)} are not the bundle's ({brief(list(self.joints))})"
            missing = [name for name in self.joints if name not in names]
            if missing:
                return f"missing: joints {brief(missing)} absent"
            used = [i for i, name in enumerate(names) if name in self._index]
            rows = [self._index[names[i]] for i in used]
            self._layout = (names, np.array(used, dtype=np.intp), np.array(rows, dtype=np.intp))
        try:
            position, velocity = np.asarray(position, dtype=float), np.asarray(velocity, dtype=float)
        except (TypeError, ValueError):
            return "nonfinite: a position or velocity is not a number"
        used = self._layout[1]
        if not (np.isfinite(position[used]).all() and np.isfinite(velocity[used]).all()):
            return "nonfinite: a position or velocity is NaN or infinite (efforts may be NaN)"
        return position, velocity

    def on_estop(self, engaged: bool, reason: str = "e-stop message") -> None:
        """`True` latches ESTOP at the next tick, which comes at once; `False` (a released button)
        changes nothing: only a reset leaves ESTOP."""
        if engaged:
            self._request("estop", reason)

    def on_reset(self) -> None:
        """ESTOP, HOLD or DAMP -> PASSIVE at the next tick, unless an e-stop arrives before that tick."""
        self._request("reset")

    def start(self) -> None:
        """Operator start: ramp to the default pose, then (after the ramp) hand over to the policy.
        Tried once, at the next tick; a refused start (no pose yet, too far from the default pose)
        is reported and must be repeated."""
        self._request("start")

    def _request(self, kind: str, reason: str = "") -> None:
        with self._lock:
            self._requests.append((kind, time.monotonic(), reason))
            if kind == "estop":  # under the lock: the tick that takes the request also clears the event
                self._estop_event.set()
                self._wake.set()

    def on_imu(self, message, received: float | None = None) -> str | None:
        """A sensor_msgs/Imu of the base (DDS or rclpy message); returns why it was refused, or None."""
        return self._on_input(self.inputs.on_imu, message, received)

    def on_velocity_command(self, message, received: float | None = None) -> str | None:
        """A geometry_msgs/Twist velocity command; returns why it was refused, or None."""
        return self._on_input(self.inputs.on_velocity_command, message, received)

    def on_object_pose(self, message, received: float | None = None) -> str | None:
        """A geometry_msgs/PoseStamped of the tracked object; returns why it was refused, or None."""
        return self._on_input(self.inputs.on_object_pose, message, received)

    def _on_input(self, handler, message, received: float | None) -> str | None:
        now = time.monotonic()
        reason = handler(message, now if received is None else min(received, now))
        if reason is not None:
            self._refuse(reason)
        return reason

    def on_task_command(self, values) -> str | None:
        try:
            values = np.asarray(values, dtype=float).reshape(-1)
        except (TypeError, ValueError):
            values = np.full(0, np.nan)
        if values.shape != self._task_command.shape or not np.isfinite(values).all():
            reason = f"command: expected {self._task_command.size} finite values, got {brief(values.tolist())}"
            self._refuse(reason)
            return reason
        self._task_command = values
        return None

    # --- the tick ----------------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> Tick:
        """One tick, not published (`tick_and_publish` publishes and finishes its timing row)."""
        now = time.monotonic() if now is None else now
        shield = self.shield
        times = self.times
        entered = shield.mode
        start = self._apply_requests()
        sample = self._latest
        fresh = sample is not None and sample is not self._used
        self._used = sample
        times.begin(sample.received if fresh and sample is not None else math.nan, time.monotonic())
        # The shield knows the measured pose from earlier ticks; start() refuses without one.
        if shield.mode == Mode.PASSIVE and (start or self._autostart) and self._controller_listening():
            if shield.start():
                self._handover = True
        fault = self.inputs.fault(now)
        if shield.mode == Mode.RAMP and self._handover:
            if fault is None and shield.run():
                self._handover = False
                # A new run starts at the default pose, an action of zeros: no previous run's last output
                # and no chunk predicted before it.
                self._last_action[:] = 0.0
                if self._chunks is not None:
                    self._chunks.clear(np.ones(1, dtype=bool))
            self._hold_back(fault[0] if fault is not None else "")
        else:
            self.held_back = ""  # no handover pending (a reset or an e-stop cancelled it)
        if fault is not None and shield.mode == Mode.RUN:
            shield.fall_back(*fault)
        obs = raw = None
        policy_time = None
        if sample is not None and shield.mode == Mode.RUN:
            inputs = {"last_action": self._last_action, "command": self._task_command} | self.inputs.values(now)
            obs = self.observation(sample.position[self._obs_rows], sample.velocity[self._obs_rows], inputs).copy()
            times.stamp(COLUMN["observed"], time.monotonic())
            raw, policy_time = self._run_policy(obs)
            times.stamp(COLUMN["decided"], time.monotonic())
        n = len(self.names)
        if sample is None:
            q, qd, received = np.full(n, np.nan), np.zeros(n), -math.inf
        else:
            q, qd, received = sample.position[self._spec_rows], sample.velocity[self._spec_rows], sample.received
        mode = shield.mode
        command = shield.tick(self.names, q, qd, received, now, raw, policy_time)
        if command.mode == Mode.ESTOP:
            self._autostart = self._handover = False  # the shield may have latched one itself (a sensor fault)
            if mode != Mode.ESTOP:
                self._latched_at = time.monotonic()
        if self.torque:
            # An effort interface has no PD of its own: the shield's damping is applied here, and only
            # with a state the shield accepted this tick (a stale or faulty velocity damps nothing).
            values = command.effort
            if sample is not None and not int(command.flags) & UNUSABLE_STATE:
                values = values + command.kp * (command.position - q) - command.kd * qd
            values = clip(values, -self._effort_limit, self._effort_limit)
        else:
            values = command.position
        self.ticks += 1
        self.last_flags = int(command.flags)
        if command.mode != entered or command.reason:
            self.last_reason = command.reason or self.last_reason
            self.changed.set()
        done = time.monotonic()
        times.stamp(COLUMN["shielded"], done)
        state = (q, qd) if sample is not None else (None, None)
        return Tick(now, obs, raw, command, values, done - received if fresh else math.nan, *state)

    def _hold_back(self, reason: str) -> None:
        """Say once why the ramp's end does not hand over (the policy would start on a missing input)."""
        if reason and not self.held_back:
            self.last_reason = f"handover held back: {reason}"
            self.changed.set()
        self.held_back = reason

    def _controller_listening(self) -> bool:
        """False (and says why, once) while nothing subscribes to the command topic."""
        if not self.config.require_subscriber or self.subscribers is None or self.subscribers() > 0:
            self.waiting = ""
            return True
        if not self.waiting:
            self.waiting = (
                f"no subscriber on {self.config.command_topic()}: staying PASSIVE until the controller is "
                "up (check the controller name, ROS_DOMAIN_ID and the network; require_subscriber=false "
                "for a setup without one)"
            )
            self.last_reason = self.waiting
            self.changed.set()  # diagnostics (and the CLI's status line) say it, off the tick
        return False

    def _run_policy(self, obs: np.ndarray) -> tuple[np.ndarray, float | None]:
        """This tick's action in [-1, 1] and the policy's run time (None on a tick a chunk policy is
        not queried: the action comes from its queue, and every one still passes the shield). A failed
        run or an output of the wrong shape reaches the shield as an unusable action (never as a
        broadcast or a first row), and empties the queue."""
        chunks = self._chunks
        if chunks is not None and not chunks.due()[0]:
            raw = chunks.act(None)[0]
            policy_time = None
        else:
            began = time.perf_counter()
            self.policy_queries += 1
            self._cost_q = math.nan  # a failed run leaves no value behind for the veto to trust
            try:
                commands, cost = self.bundle.act(obs)
                if self.config.cost_veto is not None and cost is not None:
                    self._cost_q = float(cost[0])
            except Exception as err:  # onnxruntime raises its own types; the shield counts the failure
                return self._unusable(f"policy: the bundle failed on this observation: {err}", None)
            policy_time = time.perf_counter() - began
            if commands.shape != self._output_shape:
                return self._unusable(
                    f"policy: output shape {commands.shape}, expected {self._output_shape}", policy_time
                )
            raw = self.bundle.normalized(commands)[0].astype(np.float64)
            if chunks is not None:
                if not np.isfinite(raw).all():
                    # No row of a chunk that is not finite runs: the shield counts this tick's bad action
                    # and the next tick queries again.
                    chunks.clear(np.ones(1, dtype=bool))
                    return np.full(raw.shape[-1], np.nan), policy_time
                raw = chunks.act(raw[None])[0]
        if np.isfinite(raw).all():
            if self.exploration is not None and chunks is None:
                raw = self.exploration(raw)
            self._last_action[:] = clip(raw, -1.0, 1.0)
        return raw, policy_time

    def _cost_veto(self, q: np.ndarray, qd: np.ndarray, action: np.ndarray) -> bool:
        """The shield's veto: this tick's action is unsafe when its Q_c is over `cost_veto` (or not a
        number). The shield then holds; its clamps still run on whatever it sends."""
        del q, qd, action  # Q_c was computed with the action, on the full observation
        assert self.config.cost_veto is not None
        return not (math.isfinite(self._cost_q) and self._cost_q <= self.config.cost_veto)

    def _unusable(self, reason: str, policy_time: float | None) -> tuple[np.ndarray, float | None]:
        self._refuse(reason)
        if self._chunks is not None:
            self._chunks.clear(np.ones(1, dtype=bool))
        return np.full(0, np.nan), policy_time

    def _apply_requests(self) -> bool:
        """Apply the operator requests received since the last tick; True if a start is to be tried.

        An e-stop among them wins: the shield latches ESTOP and every reset and start of this tick is
        dropped, whatever the arrival order, so no request that raced an e-stop can undo it.
        """
        with self._lock:
            requests, self._requests = self._requests, []
            self._estop_event.clear()
        if not requests:
            return False
        shield = self.shield
        estops = [reason for kind, _, reason in requests if kind == "estop"]
        if estops:
            if shield.mode != Mode.ESTOP:
                self._latched_at = time.monotonic()
            shield.estop(estops[0])
            self._autostart = self._handover = False
            return False
        start = left_estop = False
        for kind, received, reason in requests:
            if kind == "reset":
                if received > self._latched_at:  # sent after the operator could have seen the stop
                    left_estop |= shield.mode == Mode.ESTOP
                    shield.reset()
                self._handover = start = False
            elif left_estop:
                # Out of ESTOP for one tick first: a start in the reset's tick is tried at the next.
                with self._lock:
                    self._requests.insert(0, (kind, received, reason))
            else:
                start = True
        return start

    # --- the loop ----------------------------------------------------------------------------------
    def tick_and_publish(self, publish: Publish) -> Tick:
        """One tick, published, with its timing row finished: what a transport's own timer calls."""
        with self._tick_lock:
            tick = self.tick()
            self._send(publish, tick)
        return tick

    def final_command(self, publish: Publish, reason: str = "node stopped") -> Tick:
        """The last command before the node exits: an e-stop tick, queued like any e-stop so no pending
        reset undoes it. A controller keeps its last command after the node is gone, so a torque
        robot gets zero effort (not a damping torque that would stay latched)."""
        self.on_estop(True, reason)
        with self._tick_lock:
            tick = self.tick()
            if self.torque:
                tick = dataclasses.replace(tick, values=np.zeros_like(tick.values))
            self._send(publish, tick)
        return tick

    def _send(self, publish: Publish, tick: Tick) -> None:
        """Publish unless it would command a position robot to the default pose before its pose is known."""
        if self.torque or self.shield.has_pose:
            publish(tick)
        self.times.finish(time.monotonic())
        if self.on_tick is not None:
            self.on_tick(tick)

    def swap(self, bundle: PolicyBundle, version: int) -> None:
        """Run `bundle` from the next tick on: between two ticks, never inside one. The caller has
        checked that it is the same robot, observation and action (`q2real.deploy_ros.finetune`)."""
        with self._tick_lock:
            self.bundle, self.version = bundle, version

    def spin(self, stop: threading.Event, publish: Publish) -> None:
        """Tick until `stop` is set, calling `publish(tick)` after each tick.

        While states arrive about once a period (`trigger: state`), their ticks run on arrival in the
        delivering thread and this thread only keeps time: it ticks when a period's window closes
        without a state, at once on an e-stop, and collects garbage in the gap after each tick.
        Otherwise (`trigger: timer`, or a robot much faster than the policy) it ticks on the timer.
        """
        period = self.period
        slack = 0.25 * period
        self.collector.start()
        with self._tick_lock:
            self._next_at = time.monotonic() + period
            self._publish = publish
        try:
            while not stop.is_set():
                with self._tick_lock:  # a tick on arrival sets the wake-up under this lock: none is lost
                    self._wake.clear()
                    ticks, due = self.ticks, self._next_at
                on_arrival = self._ticks_on_arrival()
                deadline = due + slack if on_arrival else due
                self._wait_until(due - slack if on_arrival else due)
                if self.ticks == ticks and on_arrival and not self._estop_event.is_set():
                    # The window is open: a state that came early is used now, else the first to come.
                    if not self._take_tick(publish, expected=ticks, fresh_only=True):
                        self._wait_until(deadline)
                # The fallback tick: only for an e-stop or once the slot's deadline has really passed.
                if self.ticks == ticks and (self._estop_event.is_set() or time.monotonic() >= deadline):
                    self._take_tick(publish, expected=ticks)
                self.collector.between_ticks()
        finally:
            with self._tick_lock:
                self._publish = None
            self.collector.stop()

    def _ticks_on_arrival(self) -> bool:
        # A robot much faster than the policy always has a fresh state: plain timer ticks then.
        return self.config.trigger == "state" and self._state_period > 0.6 * self.period

    def _take_tick(
        self, publish: Publish, arrival: bool = False, expected: int | None = None, fresh_only: bool = False
    ) -> bool:
        """Tick and publish unless this period's tick was already taken; True if it ticked.

        `arrival`: for a state just delivered, which ticks once its period's window has opened and
        never waits for the lock (the loop is ticking; the state is used by the next tick).
        `expected`: the tick count the loop saw before waiting; any tick since took the slot.
        """
        if not self._tick_lock.acquire(blocking=not arrival):
            return False
        try:
            now = time.monotonic()
            period = self.period
            sample = self._latest
            fresh = sample is not None and sample is not self._used
            if arrival and not (fresh and now >= self._next_at - 0.25 * period and self._publish is publish):
                return False  # not due yet, or `spin` has ended: nothing may be published any more
            if (expected is not None and self.ticks != expected) or (fresh_only and not fresh):
                return False
            if now > self._next_at + 0.5 * period:
                self.loop_misses += 1
            self._send(publish, self.tick(now))
            # Lock onto the state stream: the next tick is due one period after this state arrived.
            locked = fresh and sample is not None and self._ticks_on_arrival()
            self._next_at = (sample.received if locked and sample is not None else self._next_at) + period
            if self._next_at + 0.25 * period < time.monotonic():
                self._next_at = time.monotonic() + period  # overran: skip the lost slots, do not burst
            if arrival:
                self._wake.set()  # the loop re-arms for the next slot
        finally:
            self._tick_lock.release()
        return True

    def _wait_until(self, deadline: float) -> None:
        """Sleep until `deadline`, or less: an e-stop or a tick on arrival ends the wait."""
        remaining = deadline - time.monotonic()
        if remaining > 0 and not self._estop_event.is_set():
            self._wake.wait(remaining)

    # --- diagnostics -------------------------------------------------------------------------------
    def diagnostics(self) -> dict[str, Any]:
        """Level (0 OK, 1 WARN, 2 ERROR), a message and key/value pairs for /diagnostics."""
        shield = self.shield
        mode = shield.mode
        if self.waiting and self.subscribers is not None and self.subscribers() > 0:
            self.waiting = ""  # the controller came up; with an operator start nothing else re-checks
        warn = mode in (Mode.HOLD, Mode.DAMP) or self.refused or self.robot_mismatch or self.waiting or self.held_back
        level = 2 if mode == Mode.ESTOP else 1 if warn else 0
        stages = self.times.summary(last=1000)
        values = {
            "mode": mode.name,
            "flags": flag_names(self.last_flags),
            "ticks": self.ticks,
            "loop_deadline_misses": self.loop_misses,
            "policy_deadline_misses": shield.counters.rules["DEADLINE_MISS"],
            **(
                {"cost_vetoes": shield.counters.rules["VETO"], "cost_q": f"{self._cost_q:.4g}"}
                if self.shield.veto
                else {}
            ),
            "policy_queries": self.policy_queries,
            "latency_p50_ms": f"{stages['total']['p50_ms']:.3f}",
            "latency_p99_ms": f"{stages['total']['p99_ms']:.3f}",
            "refused_messages": sum(self.refused.copy().values()),
            "last_refusal": self.last_refusal,
        }
        if self.waiting:
            values["waiting_for_controller"] = self.waiting
        if self.held_back:
            values["waiting_for_inputs"] = self.held_back
        for stream, age in self.inputs.ages(time.monotonic()).items():
            values[f"input_age_ms.{stream}"] = f"{1000 * age:.1f}"
        values |= {f"inputs.{k}": v for k, v in sorted(self.inputs.events.copy().items())}
        if self.robot_mismatch:
            values["robot_mismatch"] = "; ".join(self.robot_mismatch)[:REFUSAL_CHARS]
        values |= {f"stage_p99_ms.{k}": f"{v['p99_ms']:.3f}" for k, v in stages.items() if k != "total"}
        values |= {f"refused.{k}": v for k, v in sorted(self.refused.copy().items())}
        values |= {f"shield.{k}": v for k, v in shield.counters.rules.items() if v}
        return {"level": level, "message": mode.name, "values": {k: str(v) for k, v in values.items()}}


def flag_names(flags: int) -> str:
    return "|".join(str(rule.name) for rule in Rule if flags & rule) or "-"
