"""The deployment node's core: joint states in, shielded joint commands out, at the bundle's rate.

Transport-agnostic: the DDS transport (`q2real.deploy_ros.transport.dds`, ROS 2 wire format without a ROS
install) and the rclpy node (`q2real.deploy_ros.transport.rclpy_node`) both feed this class the same inputs
and publish what it returns. Everything the node knows about the robot comes from the bundle.

Each tick is a control loop's read -> update -> write, as in ros2_control:

- `read`: the newest joint state (`q2real.deploy_ros.joint_states`: checked by name, refused when it
  could not come from the bundle's robot) and whether the other inputs the bundle reads (base IMU,
  velocity command, object pose; `q2real.deploy_ros.inputs`, each with its own age limit) are usable.
- `update`: the operator's requests (`q2real.deploy_ros.requests`: e-stop wins), the handover from
  the ramp to the policy, observation -> policy (timed against the deadline) -> shield, and the
  shield's command in the robot's interface (`q2real.safety.output`, torque PD and clip included):
  the last stage; nothing changes the command after it.
- `write`: publish, finish the tick's timing row, and hand the tick to on-robot learning.

When ticks happen is `q2real.deploy_ros.schedule`: on a fresh joint state's arrival, in the thread
that delivered it, with the period's timer as the fallback; diagnostics and recording run on their
own threads, and every tick stamps where its time went (`q2real.deploy_ros.timing`).
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
from typing import Any, Protocol

import numpy as np

from q2real.contracts.chunks import ChunkQueue
from q2real.contracts.schema import BundleError, brief, robot_from_metadata
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.deploy_ros.figures import TaskFigures
from q2real.deploy_ros.inputs import Inputs
from q2real.deploy_ros.joint_states import JointSample, JointStates
from q2real.deploy_ros.observation import ObservationBuilder
from q2real.deploy_ros.requests import Applied, OperatorRequests
from q2real.deploy_ros.schedule import Publish, TickLoop
from q2real.deploy_ros.settings import NODE_NAME, NodeConfig, local_robot, resolve_topic
from q2real.deploy_ros.timing import COLUMN, TickTimes
from q2real.hardware.model import load_model
from q2real.hardware.spec import RobotSpec, SpecError, differences, tighter
from q2real.safety.compiled import MAX_JOINTS, Shield
from q2real.safety.flags import Mode, Rule
from q2real.safety.limits import clip
from q2real.safety.output import Output
from q2real.safety.shield import Command

REFUSAL_CHARS = 300
"""Longest refusal reason kept for diagnostics: a hostile message must not be republished whole."""
MAX_REWARD = 1e6
"""Largest magnitude a reward from the reward input may have: beyond it, a sender's fault, not a reward."""


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


@dataclass(frozen=True)
class Reading:
    """What a tick read."""

    now: float
    sample: JointSample | None
    """The newest joint state (None before the first)..."""
    fresh: bool
    """...and whether no tick took it before."""
    fault: tuple[str, Mode | None] | None
    """Why the other inputs do not let the policy run, and the mode to fall back to (`Inputs.fault`)."""


class OnRobotLearning(Protocol):
    """Learning on the robot's own stream (`q2real.deploy_ros.learning.robot_side`), given to the node when it is
    built: it perturbs the policy's action before the shield and sees every published tick."""

    def explore(self, action: np.ndarray) -> np.ndarray: ...

    def on_tick(self, tick: Tick) -> None: ...

    def on_reward(self, value: float) -> None: ...

    def diagnostics(self) -> dict[str, object]:
        """Its progress for /diagnostics and the console (keys `finetune.*`)."""
        ...


class PolicyNode:
    """Bundle + observation builder + shield, with the node's inputs and its tick."""

    def __init__(
        self,
        bundle: str | Path,
        config: NodeConfig | None = None,
        learning: Callable[[PolicyNode], OnRobotLearning] | None = None,
    ):
        """`learning`: builds the on-robot learning this node runs with (`RobotLearning.attach`)."""
        self.config = config = config or NodeConfig()
        config.validate()
        self.bundle = PolicyBundle(bundle, runtime=config.policy_runtime)
        source = str(bundle)
        meta = self.bundle.info.metadata
        trained = robot_from_metadata(meta, source)
        robot = self._checked_robot(trained, source, meta["robot"]["sha256"])
        self.spec = dataclasses.replace(robot, control_period=config.control_period or trained.control_period)
        self.period = self.spec.control_period
        self.observation = ObservationBuilder(meta, source, functools.partial(load_model, self._local))
        self.inputs = Inputs(self.observation, config.inputs, self.spec.imu, config.topics, source)
        self.figures = TaskFigures(meta, self.observation, functools.partial(load_model, self._local), source)
        """How the task goes, for the operator: sampled with the diagnostics, never on a tick."""
        """The IMU, velocity command and object pose streams the policy reads, with their age limits."""
        self.names = self.spec.joint_names
        # Every joint a valid message must carry: the actuated ones and the ones the policy observes.
        joints = tuple(self.names) + tuple(j for j in self.observation.joints if j not in self.names)
        self.states = JointStates(joints, config.extra_joints, str(self.bundle.path), self.spec.name)
        self._spec_rows = np.arange(len(self.names))
        self._obs_rows = np.array([joints.index(j) for j in self.observation.joints], dtype=np.intp)
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
        if len(self.names) > MAX_JOINTS:
            raise BundleError(
                f"{source}: metadata.robot: {len(self.names)} joints; the compiled shield "
                f"(q2real.safety.compiled) takes at most {MAX_JOINTS}, so this robot cannot be deployed behind it"
            )
        self.shield = Shield(self.spec, shield_config, veto=veto)
        self.output = Output(self.spec)
        """The last stage: the shield's command in the robot's interface, as published."""
        self.torque = self.output.torque
        self.interface = self.output.interface
        """The joints' command interface: an effort controller for torque robots, position otherwise."""
        wake = threading.Event()
        """Set by an e-stop and after a tick on arrival: the loop re-arms its wait."""
        self.requests = OperatorRequests(wake)
        self.loop = TickLoop(self, wake, self.requests.estop, config.realtime.gc == "between_ticks")
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
        self._handover = False
        self._autostart = config.autostart
        """Armed until the first e-stop: after one, only an explicit start runs the policy again."""
        self._autostart_refusal = ""
        """Why autostart last did not start, said once until it starts or the mode changes."""
        self._task_command = np.zeros(self.observation.command_dim)
        self._command_heard = self.observation.command_dim == 0
        """A policy that reads a task command (a reach target) never runs on a made-up one: the handover
        waits for the first message on the command topic."""
        self._no_command = (
            f"no command on {resolve_topic(config.topics.task_command, NODE_NAME)} yet: the policy reads "
            f"{self.observation.command_dim} values there (std_msgs/Float64MultiArray)"
        )
        self._last_action = np.zeros(self.bundle.info.action_dim, dtype=np.float32)
        self._action_history = np.zeros(self.observation.history_ticks * self._last_action.size, dtype=np.float32)
        """The policy's outputs before its previous one, newest first, for `action_history` terms."""
        chunk, width = self.bundle.info.chunk, self.bundle.info.action_dim
        self._chunks = ChunkQueue(chunk, 1, width, np) if chunk.size > 1 else None
        """A chunk policy's actions still to come; the policy runs only on the ticks it is due."""
        self._output_shape = (1, *((chunk.size,) if chunk.size > 1 else ()), width)
        self.policy_queries = 0
        """Ticks on which the policy ran (all RUN ticks, or a chunk policy's due ticks)."""
        self.cost_q_range = (math.inf, -math.inf)
        """The lowest and highest finite Q_c the cost critic gave (with `cost_veto`)."""
        self.refused: Counter[str] = Counter()
        self.last_refusal = ""
        self.ticks = 0
        self.last_flags = 0
        self.version = 0
        """Which version of the policy runs: 0 the bundle started with, then those swapped in (`swap`)."""
        self.learning = learning(self) if learning is not None else None
        """Fine-tuning on the robot: its bounded noise on the policy's action, before the shield, and
        every tick after it was published, under the tick lock (None: the policy runs as it is)."""

    @property
    def joints(self) -> tuple[str, ...]:
        """Every joint a valid joint state must carry: the actuated ones, then the observed ones."""
        return self.states.joints

    @property
    def loop_misses(self) -> int:
        return self.loop.misses

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
        self.states.check_robot(names)

    def on_joint_state(
        self, names, position, velocity, effort, received: float | None = None, stamp: float = 0.0
    ) -> str | None:
        """Store a joint state message (and tick on it, when it is due); returns why it was refused, or
        None. `stamp`: its header stamp in wall-clock seconds (0: unset, as the transports pass an unset
        header stamp)."""
        skew = self.config.inputs.max_stamp_skew
        if skew is not None:
            reason = _stamp_refusal(stamp, skew)
            if reason is not None:
                self._refuse(reason)
                return reason
        now = time.monotonic()
        # A stamp from the future would make the state look fresh for longer than it is.
        received = now if received is None else min(received, now)
        reason = self.states.store(list(names), position, velocity, effort, received)
        if reason is not None:
            self._refuse(reason)
            return reason
        self.loop.on_arrival()
        return None

    def _refuse(self, reason: str) -> None:
        self.refused[reason.split(":")[0]] += 1
        self.last_refusal = reason[:REFUSAL_CHARS]

    def on_reward(self, value: float) -> str | None:
        """A reward from the reward input, for on-robot learning; returns why it was refused, or None."""
        if self.learning is None:
            reason = "reward: no on-robot learning runs on this node"
        elif not abs(value) <= MAX_REWARD:
            reason = f"reward: {value!r}: expected a finite number within +-{MAX_REWARD:g}"
        else:
            self.learning.on_reward(value)
            return None
        self._refuse(reason)
        return reason

    def on_estop(self, engaged: bool, reason: str = "e-stop message") -> None:
        """`True` latches ESTOP at the next tick, which comes at once; `False` (a released button)
        changes nothing: only a reset leaves ESTOP."""
        if engaged:
            self.requests.push("estop", reason)

    def on_stop(self) -> None:
        """Operator stop (`~/stop`): an e-stop, latched the same way; a reset, then a start, resumes."""
        self.on_estop(True, "operator stop")

    def on_reset(self) -> None:
        """ESTOP, HOLD or DAMP -> PASSIVE at the next tick, unless an e-stop arrives before that tick."""
        self.requests.push("reset")

    def start(self) -> None:
        """Operator start: ramp to the default pose, then (after the ramp) hand over to the policy.
        Tried once, at the next tick; a refused start (no pose yet, too far from the default pose)
        is reported and must be repeated."""
        self.requests.push("start")

    def operate(self, kind: str, timeout: float | None = None) -> tuple[bool, str]:
        """An operator request (`start`, `stop` or `reset`) answered with what happened, as a service
        replies: queued like the topics' requests, applied at the next tick, then judged on the mode
        that tick left (a stop is a latched e-stop: a reset, then a start, resumes)."""
        ticks = self.ticks
        if kind == "stop":
            self.on_stop()
        elif kind == "reset":
            self.on_reset()
        elif kind == "start":
            self.start()
        else:
            raise ValueError(f"operate: expected start, stop or reset, got {kind!r}")
        deadline = time.monotonic() + (timeout if timeout is not None else max(0.5, 5 * self.period))
        while self.ticks < ticks + 2 and time.monotonic() < deadline:  # the tick under way may predate it
            time.sleep(min(self.period / 4, 0.01))
        mode = self.shield.mode
        done = {"start": mode in (Mode.RAMP, Mode.RUN), "stop": mode == Mode.ESTOP, "reset": mode == Mode.PASSIVE}
        if self.ticks < ticks + 2:
            why = "no tick ran: is the robot publishing joint states?"
        else:
            why = self.waiting or self.held_back or ("" if done[kind] else self.last_reason)
        return done[kind] and self.ticks >= ticks + 2, f"mode {mode.name}" + (f": {why}" if why else "")

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
        """A task command (std_msgs/Float64MultiArray data); returns why it was refused, or None. Only a
        command of the right length, every value within the range the policy was trained on, replaces
        the one the policy reads."""
        try:
            values = np.asarray(values, dtype=float).reshape(-1)
        except (TypeError, ValueError, OverflowError):
            values = np.full(0, np.nan)
        topic = resolve_topic(self.config.topics.task_command, NODE_NAME)
        if values.shape != self._task_command.shape or not np.isfinite(values).all():
            reason = f"command: {topic}: expected {self._task_command.size} finite values, got {brief(values.tolist())}"
        else:
            reason = self.observation.command_refusal(values)
            reason = f"command: {topic}: {reason}" if reason is not None else None
        if reason is not None:
            self._refuse(reason)
            return reason
        self._task_command = values
        self._command_heard = True
        return None

    # --- the tick: read -> update -> write -------------------------------------------------------
    def tick(self, now: float | None = None) -> Tick:
        """One tick, not published (`tick_and_publish` publishes and finishes its timing row)."""
        return self.update(self.read(time.monotonic() if now is None else now))

    def read(self, now: float) -> Reading:
        """The newest joint state and the state of the other inputs; starts the tick's timing row."""
        sample, fresh = self.states.take()
        self.times.begin(sample.received if fresh and sample is not None else math.nan, time.monotonic())
        fault = self.inputs.fault(now)
        if fault is None and not self._command_heard:
            fault = (self._no_command, None)
        return Reading(now, sample, fresh, fault)

    def update(self, reading: Reading) -> Tick:
        """Requests, handover, observation -> policy -> shield -> the command in the robot's interface."""
        shield, times, sample = self.shield, self.times, reading.sample
        entered = shield.mode
        self._handover_step(self.requests.apply(shield), reading.fault)
        obs = raw = None
        policy_time = None
        if sample is not None and shield.mode == Mode.RUN:
            inputs = {"last_action": self._last_action, "action_history": self._action_history}
            inputs |= {"command": self._task_command} | self.inputs.values(reading.now)
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
        command = shield.tick(self.names, q, qd, received, reading.now, raw, policy_time)
        if command.mode == Mode.ESTOP:
            self._autostart = self._handover = False  # the shield may have latched one itself (a sensor fault)
            if mode != Mode.ESTOP:
                self.requests.latched_at = time.monotonic()
        if obs is not None:
            self.figures.latest = (obs, q)
        state = (q, qd) if sample is not None else (None, None)
        values = self.output(command, *state)
        self.ticks += 1
        self.last_flags = int(command.flags)
        if command.mode != entered or command.reason:
            self.last_reason = command.reason or self.last_reason
            self.changed.set()
        done = time.monotonic()
        times.stamp(COLUMN["shielded"], done)
        latency = done - received if reading.fresh else math.nan
        return Tick(reading.now, obs, raw, command, values, latency, *state)

    def write(self, publish: Publish, tick: Tick) -> None:
        """Publish unless it would command a position robot to the default pose before its pose is
        known; finish the timing row; hand the tick to on-robot learning."""
        if self.torque or self.shield.has_pose:
            publish(tick)
        self.times.finish(time.monotonic())
        if self.learning is not None:
            self.learning.on_tick(tick)

    def _handover_step(self, applied: Applied, fault: tuple[str, Mode | None] | None) -> None:
        """The operator's requests and the mode handover: PASSIVE -> RAMP on a start (or autostart, once
        a controller listens), RAMP -> RUN once the ramp is done and every input is usable, and RUN
        back to the fallback when an input faults."""
        shield = self.shield
        if applied.estopped:
            self._autostart = self._handover = False
        elif applied.reset:
            self._handover = False
        for reason in applied.dropped:
            self._refuse_start(reason)
        # The shield knows the measured pose from earlier ticks; start() refuses without one.
        started = False
        passive = shield.mode == Mode.PASSIVE
        listening = passive and (applied.start or self._autostart) and self._controller_listening()
        # Autostart asks every tick: it starts once the pose is within the ramp's reach, and a pose out of
        # reach is said (and counted) once, not refused by the shield tick after tick.
        out_of_reach = listening and not applied.start and shield.within_ramp() is False
        if listening and not out_of_reach:
            started = shield.start("operator start" if applied.start else "autostart")
            self._handover |= started
        if applied.start and not started:
            self._refuse_start(self._why_not_started())
        elif out_of_reach and self._autostart_refusal != (reason := "auto" + self._why_not_started()):
            self._autostart_refusal = reason
            self._refuse_start(reason)
        if started or not passive:
            self._autostart_refusal = ""
        if shield.mode == Mode.RAMP and self._handover:
            if fault is None and shield.run():
                self._handover = False
                # A new run starts at the default pose, an action of zeros: no previous run's last output
                # and no chunk predicted before it.
                self._last_action[:] = 0.0
                self._action_history[:] = 0.0
                if self._chunks is not None:
                    self._chunks.clear(np.ones(1, dtype=bool))
            self._hold_back(fault[0] if fault is not None else "")
        else:
            self.held_back = ""  # no handover pending (a reset or an e-stop cancelled it)
        if fault is not None and shield.mode == Mode.RUN:
            shield.fall_back(*fault)

    def _why_not_started(self) -> str:
        """Why this tick's operator start did not begin a ramp."""
        shield, mode = self.shield, self.shield.mode
        if mode == Mode.RAMP:
            return "start: already ramping to the default pose"
        if mode == Mode.RUN:
            return "start: the policy already runs"
        if mode != Mode.PASSIVE:
            return f"start: the shield is in {mode.name}, which only a reset leaves; reset, then start"
        if self.waiting:
            return f"start: {self.waiting}"
        if not shield.has_pose:
            return "start: no valid joint state yet; the ramp starts from the measured pose"
        limit = shield.config.ramp_max_distance
        return (
            f"start: ramp refused: the measured pose is farther than shield.ramp_max_distance ({limit}) from the "
            "default pose"
        )

    def _refuse_start(self, reason: str) -> None:
        """A start that was not carried out, counted and said at once on /diagnostics (and, through it, on
        the console): an operator's request is never dropped in silence."""
        self._refuse(reason)
        if reason != self.last_reason:
            self.last_reason = reason
            self.changed.set()

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
            finite = bool(np.isfinite(raw).all())
            policy_time = None
        else:
            began = time.perf_counter()
            self.policy_queries += 1
            self._cost_q = math.nan  # a failed run leaves no value behind for the veto to trust
            try:
                commands, cost = self.bundle.act(obs)
                if self.config.cost_veto is not None and cost is not None:
                    self._cost_q = value = float(cost[0])
                    if math.isfinite(value):
                        low, high = self.cost_q_range
                        self.cost_q_range = (min(low, value), max(high, value))
            except Exception as err:  # onnxruntime raises its own types; the shield counts the failure
                return self._unusable(f"policy: the bundle failed on this observation: {err}", None)
            policy_time = time.perf_counter() - began
            if commands.shape != self._output_shape:
                return self._unusable(
                    f"policy: output shape {commands.shape}, expected {self._output_shape}", policy_time
                )
            raw, finite = self.bundle.action(commands)
            if chunks is not None:
                if not finite:
                    # No row of a chunk that is not finite runs: the shield counts this tick's bad action
                    # and the next tick queries again.
                    chunks.clear(np.ones(1, dtype=bool))
                    return np.full(commands.shape[-1], np.nan), policy_time
                raw = chunks.act(raw.reshape(commands.shape))[0]
        if finite:
            if self.learning is not None and chunks is None:
                raw = self.learning.explore(raw)
            if self._action_history.size:
                self._action_history[self._last_action.size :] = self._action_history[: -self._last_action.size]
                self._action_history[: self._last_action.size] = self._last_action
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

    # --- the loop ----------------------------------------------------------------------------------
    def spin(self, stop: threading.Event, publish: Publish) -> None:
        """Tick until `stop` is set, calling `publish(tick)` after each tick (`TickLoop.spin`)."""
        self.loop.spin(stop, publish)

    def tick_and_publish(self, publish: Publish) -> Tick:
        """One tick, published, with its timing row finished: what a transport's own timer calls."""
        with self.loop.lock:
            tick = self.tick()
            self.write(publish, tick)
        return tick

    def final_command(self, publish: Publish, reason: str = "node stopped") -> Tick:
        """The last command before the node exits: an e-stop tick, queued like any e-stop so no pending
        reset undoes it, its values as the output stage sends them when the node stops."""
        self.on_estop(True, reason)
        with self.loop.lock:
            tick = self.tick()
            tick = dataclasses.replace(tick, values=self.output.stopped(tick.values))
            self.write(publish, tick)
        return tick

    def swap(self, bundle: PolicyBundle, version: int) -> None:
        """Run `bundle` from the next tick on: between two ticks, never inside one. The caller has
        checked that it is the same robot, observation and action (`q2real.deploy_ros.learning.robot_side`)."""
        with self.loop.lock:
            self.bundle, self.version = bundle, version

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
        values |= self.figures.sample()
        if self.learning is not None:
            values |= self.learning.diagnostics()
        return {"level": level, "message": mode.name, "values": {k: str(v) for k, v in values.items()}}


def _stamp_refusal(stamp: float, skew: float) -> str | None:
    """Why a joint state's header stamp is refused under `inputs.max_stamp_skew`, or None. An unset stamp
    (0, 1970-01-01) is refused too: with the check on, a stamp that cannot be compared is no better than
    one from a clock that drifted."""
    if stamp == 0.0:
        return (
            "stamp: unset (0): the robot must stamp its joint states when inputs.max_stamp_skew is set "
            "(leave max_stamp_skew unset for a robot whose clock is not synchronized)"
        )
    offset = stamp - time.time()
    if abs(offset) <= skew:
        return None
    return (
        f"stamp: {offset:+.3g} s from this machine's clock (inputs.max_stamp_skew {skew:g} s): "
        "is the robot's clock synchronized?"
    )


def flag_names(flags: int) -> str:
    return "|".join(str(rule.name) for rule in Rule if flags & rule) or "-"
