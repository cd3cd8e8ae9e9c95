"""`q2real deploy`: a bundle on a robot over DDS, optionally against the sim-in-the-loop robot.

With `sim=True` the robot is the sim robot (`q2real-sim-robot`, `q2real.gate.sim_robot`) in its own
process (the bundle's robot, loopback DDS), started before the node and stopped on every way out of
`deploy`, start-up failures included; it also exits by itself if this process dies. Otherwise the
node waits for a real robot's joint states. Ctrl-C, SIGTERM (systemd, a launch file), the duration
running out, or an error stops the node, which then sends a last safe command (the shield's
fallback) and closes the bag. The real-time settings (`realtime.*`) are applied after the sim robot
is started (it must not inherit them) and before the node's DDS threads exist (they must)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from q2real.configs.loader import ConfigError
from q2real.deploy_ros import realtime
from q2real.deploy_ros.figures import figures_line
from q2real.deploy_ros.learning.robot_side import RobotLearning
from q2real.deploy_ros.node import PolicyNode
from q2real.deploy_ros.observation import VELOCITY_COMMAND_NAMES
from q2real.deploy_ros.programs import SIM_ROBOT, program
from q2real.deploy_ros.settings import NodeConfig
from q2real.deploy_ros.signals import on_signal
from q2real.deploy_ros.transport.dds import ROBOT_STARTUP, DdsNode, use_loopback
from q2real.deploy_ros.transport.diagnostics import Report
from q2real.safety.compiled import COMPILE_SECONDS
from q2real.safety.flags import Mode

SIM_STARTUP = 30.0
"""Seconds to wait for the sim robot's first joint state: its process imports MuJoCo (and, for a task's
world, the simulator and torch) and compiles the model first, which no real robot's latency includes."""


@dataclass
class Summary:
    ticks: int
    mode: str
    latency_p50_ms: float
    latency_p99_ms: float
    loop_deadline_misses: int
    refused_messages: int
    shield_counters: dict[str, int]
    run_ticks: int
    """Ticks the policy ran (shield in RUN)."""
    run_interventions: int
    """Of those, ticks on which one of the shield's clamps changed the policy's command."""
    run_change: float
    """Their sum of how far the clamps moved it (`q2real.safety.shield.Counters.run_change`)."""
    stages: dict[str, dict[str, float]]
    """p50/p99/max milliseconds per stage of the tick path (`q2real.deploy_ros.timing.SPANS`)."""
    realtime: list[str]
    """The real-time settings that were applied."""
    stopped_by: str = "stop requested"
    """What ended the run: `duration`, `Ctrl-C`, `SIGTERM`, or `stop requested` (the caller's event)."""
    mode_at_stop: str = "PASSIVE"
    """The shield's mode on the last tick before the stop (the final command is always an e-stop)."""
    policy_queries: int = 0
    """Ticks on which the policy ran (all RUN ticks, or a chunk policy's due ticks)."""
    cost_q_range: tuple[float, float] | None = None
    """The cost critic's lowest and highest Q_c over the run (with `cost_veto`; None without)."""
    finetune: dict[str, object] | None = None
    """With fine-tuning: versions swapped in, refused, rolled back and accepted, the version running at
    the end, the learner's exit status (None: it was still running) and the fine-tuning directory."""
    figures: str = ""
    """The task's figures over the run (`TaskFigures.summary`); empty when the policy never ran."""


def start_sim_robot(
    robot: str,
    config: NodeConfig,
    rate: float | None = None,
    extra: list[str] | None = None,
    task: str | None = None,
    initial: dict[str, float] | None = None,
):
    """The sim robot as a child process on loopback DDS, its joints at `initial` (default: the spec's
    default pose); returns the Popen.

    A floating base hangs on the gantry until the ramp has had its time after the node's first
    command (so a humanoid does not fall before the policy takes over); `task` makes it play that
    task's world (the tracked object). The child watches this process (`--parent-pid`) and exits
    when it dies, even by SIGKILL, so that no robot is left publishing joint states on the wire with
    nobody commanding it.
    """
    command = [program(SIM_ROBOT), robot, "--loopback"]
    command += ["--command-style", config.command_style, "--parent-pid", str(os.getpid())]
    command += ["--gantry", str(config.shield.ramp_time)]
    if rate is not None:
        command += ["--rate", str(rate)]
    if task is not None:
        command += ["--task", task]
    if initial:
        command += ["--initial", *(f"{joint}={value!r}" for joint, value in initial.items())]
    use_loopback()  # the child inherits the environment, so both ends use the same DDS settings
    return subprocess.Popen(command + (extra or []))


def check_sim_command(node: PolicyNode, sim_argv: list[str]) -> None:
    """Refuse a fixed `--command` for the sim robot that the policy cannot read, before anything starts:
    the sim robot would exit on it, and the node would then wait for joint states that never come."""
    if "--command" not in sim_argv:
        return
    given = list(itertools.takewhile(lambda arg: not arg.startswith("--"), sim_argv[sim_argv.index("--command") + 1 :]))
    if node.observation.command_dim:
        names = node.observation.command_names
    elif "velocity_command" in node.inputs.streams:
        names = list(VELOCITY_COMMAND_NAMES)
    else:
        raise ConfigError(f"--command: the policy of {node.bundle.path} reads no task command; leave --command out")
    if len(given) != len(names):
        raise ConfigError(
            f"--command: the policy of {node.bundle.path} reads {len(names)} command values ({', '.join(names)}), "
            f"got {len(given)}: {' '.join(given)}"
        )


def stop_sim_robot(process: subprocess.Popen, timeout: float = 5.0) -> None:
    """Terminate and reap the sim robot; kill it if it hangs or a second Ctrl-C cuts the wait short."""
    process.terminate()
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def deploy(
    bundle: str | Path,
    config: NodeConfig,
    sim: bool = False,
    duration: float | None = None,
    stop: threading.Event | None = None,
    status_every: float | None = 1.0,
    sim_rate: float | None = None,
    operator_start: bool = False,
    timings: str | Path | None = None,
    sim_initial: dict[str, float] | None = None,
    sim_extra: list[str] | None = None,
) -> Summary:
    """Run until `stop`, the duration or Ctrl-C; `operator_start` reads Enter on stdin as the start;
    `timings`: write every tick's stage timestamps there as CSV at the end; `sim_initial`: the sim
    robot's initial joint positions; `sim_extra`: more of its command-line options (a dynamics shift).
    With fine-tuning on (`config.finetune.run` or `.learner_address`) the learner starts (and must
    load) before the robot does."""
    stopper = Stopper(stop or threading.Event())
    stop = stopper.event
    if sim:
        use_loopback()
    node = PolicyNode(bundle, config, RobotLearning.attach(config.finetune) if config.finetune.enabled else None)
    if sim:
        check_sim_command(node, sim_extra or [])
    tuning = node.learning if isinstance(node.learning, RobotLearning) else None
    # Paid when the node's modules were imported: before the robot is even awaited, never in a tick.
    print(f"shield: compiled kernels ready ({COMPILE_SECONDS:.2f} s to compile or load from the cache)", flush=True)
    print(f"policy: {node.bundle.runtime} ({node.bundle.compile_seconds:.2f} s to compile and check)", flush=True)
    robot = None
    switch_interval = sys.getswitchinterval()
    applied: list[str] = []
    previous_sigterm = None
    if threading.current_thread() is threading.main_thread():
        previous_sigterm = on_signal(signal.SIGTERM, lambda: stopper.set("SIGTERM"))
    try:
        if tuning is not None:
            tuning.start()  # before the real-time settings, which the learner must not inherit
        if sim:
            # The robot alone, unless the policy observes an object of its task's world or reads a command,
            # which the sim robot then publishes: the task's own, one per episode, unless a fixed one is given.
            reads_command = node.observation.command_dim > 0 or "velocity_command" in node.inputs.streams
            world = "object_pose" in node.inputs.streams or reads_command
            task = node.bundle.info.metadata.get("task") if world else None
            if reads_command and "--command" not in (sim_extra or []):
                sim_extra = [*(sim_extra or []), "--task-commands"]
            rate = sim_rate or 1.0 / node.period
            robot = start_sim_robot(node.spec.name, config, rate=rate, task=task, initial=sim_initial, extra=sim_extra)
        applied = realtime.apply(config.realtime)
        if applied:
            print(f"real-time settings: {', '.join(applied)}", flush=True)
        startup = SIM_STARTUP if sim else ROBOT_STARTUP
        _serve(node, config, stopper, duration, status_every, operator_start, startup, tuning)
    finally:
        if previous_sigterm is not None:  # a later deploy in this process (the gate's episodes) sets its own
            signal.signal(signal.SIGTERM, previous_sigterm)
        sys.setswitchinterval(switch_interval)
        if tuning is not None:
            tuning.close()
        # Every exit, start-up failures included (bad topic, bag path, no robot), stops the child.
        if robot is not None:
            stop_sim_robot(robot)
        if timings is not None:
            node.times.write_csv(timings)
    stages = node.times.summary()
    return Summary(
        ticks=node.ticks,
        mode=node.shield.mode.name,
        latency_p50_ms=stages["total"]["p50_ms"],
        latency_p99_ms=stages["total"]["p99_ms"],
        loop_deadline_misses=node.loop_misses,
        refused_messages=sum(node.refused.values()),
        shield_counters={k: v for k, v in node.shield.counters.rules.items() if v},
        run_ticks=node.shield.counters.run_ticks,
        run_interventions=node.shield.counters.run_interventions,
        run_change=node.shield.counters.run_change,
        stages=stages,
        realtime=applied,
        stopped_by=stopper.reason or "stop requested",
        mode_at_stop=stopper.mode,
        policy_queries=node.policy_queries,
        cost_q_range=node.cost_q_range if math.isfinite(node.cost_q_range[0]) else None,
        finetune=tuning.summary() if tuning is not None else None,
        figures=node.figures.summary(),
    )


class Stopper:
    """The run's stop event and what set it first, so the console says how the run ended."""

    def __init__(self, event: threading.Event):
        self.event, self.reason, self.mode = event, "", Mode.PASSIVE.name

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.event.set()


def _serve(
    node: PolicyNode,
    config: NodeConfig,
    stopper: Stopper,
    duration: float | None,
    status_every: float | None,
    operator_start: bool,
    startup: float = ROBOT_STARTUP,
    tuning: RobotLearning | None = None,
) -> None:
    """The node on DDS until `stop`; it always ends with a last safe command and a closed bag.
    `startup`: seconds to wait for the first joint state when `startup_timeout` is not set."""
    transport = DdsNode(node, on_report=ModeLines() if status_every else None)
    stop = stopper.event
    recorder = None
    try:
        if config.record:
            from q2real.deploy_ros.watch.recorder import Recorder

            metadata = node.bundle.info.metadata
            topic, kind = transport.command_topic, transport.command_type
            recorder = Recorder(config.record, topic, kind, metadata, inputs=transport.input_topics)
            transport.recorder = recorder
            if tuning is not None:
                tuning.record = recorder.write_event
        transport.wait_for_robot(startup)
        if duration is not None:
            timer = threading.Timer(duration, stopper.set, ("duration",))
            timer.daemon = True
            timer.start()
        if operator_start:
            threading.Thread(target=_wait_for_enter, args=(node,), daemon=True).start()
        if status_every:
            threading.Thread(target=_print_status, args=(node, status_every, stop), daemon=True).start()
        try:
            node.spin(stop, transport.publish)
        except KeyboardInterrupt:
            stopper.reason = stopper.reason or "Ctrl-C"
    finally:
        stopper.set("")
        stopper.mode = node.shield.mode.name
        # A last command in the fallback mode, so the robot is not left on the policy's last action.
        node.final_command(transport.publish)
        transport.close()
        if recorder is not None:
            if tuning is not None:
                tuning.record = None  # the bag closes; the watcher's later events go to stdout only
            recorder.close()
            if recorder.lost:
                print(f"record: {recorder.lost} messages could not be written (first: {recorder.first_error})")


def _wait_for_enter(node: PolicyNode) -> None:
    """Every Enter is a start (after an e-stop and a reset too), until stdin closes."""
    while sys.stdin.readline():
        node.start()


class ModeLines:
    """The console's line for every mode change and every reason the node gives (`12:00:01  mode ESTOP:
    operator stop`), printed as the report goes out, at once: the periodic status line may come a
    second later, and a tick never prints."""

    def __init__(self, out: Callable[[str], None] | None = None):
        self._out = out or functools.partial(print, flush=True)
        self._mode = Mode.PASSIVE.name  # where every node starts: not a change worth a line

    def __call__(self, report: Report) -> None:
        mode, message = report["values"]["mode"], report["message"]
        if mode != self._mode or message != mode:  # the message is `MODE: reason` when there is a reason
            self._mode = mode
            self._out(f"{time.strftime('%H:%M:%S')}  mode {message}")


def _print_status(node: PolicyNode, every: float, stop: threading.Event) -> None:
    refused = 0
    while not stop.wait(every):
        line, refused = _status_line(node, refused)
        print(line, flush=True)


def _status_line(node: PolicyNode, refused_before: int = 0) -> tuple[str, int]:
    """The console's status line, with the newest refusal when messages were refused since the last
    line (`refused_before` of them then); and the count now."""
    report = node.diagnostics()["values"]
    refused = int(report["refused_messages"])
    notes = [report[key] for key in ("waiting_for_controller", "waiting_for_inputs") if key in report]
    figures = figures_line(report)
    if figures:
        notes.insert(0, f"figures: {figures}")
    if "finetune.version" in report:
        notes.append(
            f"finetune: v{report['finetune.version']} runs (good v{report['finetune.good_version']}), "
            f"{report['finetune.transitions']} transitions, learner at {report['finetune.learner_steps']} steps "
            f"and {report['finetune.learner_updates']} updates; versions {report['finetune.versions']}"
        )
        if "finetune.trial" in report:
            notes.append(f"trial: {report['finetune.trial']}")
    if refused > refused_before:
        notes.append(f"refused: {report['last_refusal']}")
    line = (
        f"{time.strftime('%H:%M:%S')}  mode {report['mode']:<7} ticks {report['ticks']:>6}  "
        f"latency p50 {report['latency_p50_ms']} ms p99 {report['latency_p99_ms']} ms  "
        f"loop misses {report['loop_deadline_misses']}  refused {refused}"
    )
    return line + "".join(f"\n  {note}" for note in notes), refused
