"""`q2real deploy`: a bundle on a robot over DDS, optionally against the sim-in-the-loop robot.

With `sim=True` the robot is `q2real.hardware.sim_robot` in its own process (the bundle's robot,
loopback DDS), started before the node and stopped after it; otherwise the node waits for a real
robot's joint states. Ctrl-C, the duration running out, or an error stops the node, which then
sends a last safe command (the shield's fallback) and closes the bag.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from q2real.deploy_ros.dds import DdsNode, use_loopback
from q2real.deploy_ros.node import NodeConfig, PolicyNode


@dataclass
class Summary:
    ticks: int
    mode: str
    latency_p50_ms: float
    latency_p99_ms: float
    loop_deadline_misses: int
    refused_messages: int
    shield_counters: dict[str, int]


def start_sim_robot(robot: str, config: NodeConfig, rate: float | None = None, extra: list[str] | None = None):
    """The sim robot as a child process on loopback DDS; returns the Popen."""
    command = [sys.executable, "-m", "q2real.hardware.sim_robot", robot, "--loopback"]
    command += ["--command-style", config.command_style]
    if rate is not None:
        command += ["--rate", str(rate)]
    use_loopback()  # the child inherits the environment, so both ends use the same DDS settings
    return subprocess.Popen(command + (extra or []))


def deploy(
    bundle: str | Path,
    config: NodeConfig,
    sim: bool = False,
    duration: float | None = None,
    stop: threading.Event | None = None,
    status_every: float | None = 1.0,
    sim_rate: float | None = None,
    operator_start: bool = False,
) -> Summary:
    """Run until `stop`, the duration or Ctrl-C; `operator_start` reads Enter on stdin as the start."""
    stop = stop or threading.Event()
    if sim:
        use_loopback()
    node = PolicyNode(bundle, config)
    robot = None
    if sim:
        _check_sim_spec(node)
        robot = start_sim_robot(node.spec.name, config, rate=sim_rate or 1.0 / node.period)
    recorder = None
    transport = DdsNode(node)
    if config.record:
        from q2real.deploy_ros.recorder import Recorder

        recorder = Recorder(config.record, transport.command_topic, transport.command_type, node.bundle.info.metadata)
        transport.recorder = recorder
    try:
        transport.wait_for_robot()
        if duration is not None:
            timer = threading.Timer(duration, stop.set)
            timer.daemon = True
            timer.start()
        if operator_start:
            threading.Thread(target=_wait_for_enter, args=(node,), daemon=True).start()
        if status_every:
            threading.Thread(target=_print_status, args=(node, status_every, stop), daemon=True).start()
        node.spin(stop, transport.publish)
    finally:
        stop.set()
        # A last command in the fallback mode, so the robot is not left on the policy's last action.
        node.shield.estop("node stopped")
        transport.publish(node.tick())
        transport.close()
        if recorder is not None:
            recorder.close()
        if robot is not None:
            robot.terminate()
            robot.wait(10)
    lat = np.array(node.latencies) * 1e3 if node.latencies else np.array([np.nan])
    return Summary(
        ticks=node.ticks,
        mode=node.shield.mode.name,
        latency_p50_ms=float(np.percentile(lat, 50)),
        latency_p99_ms=float(np.percentile(lat, 99)),
        loop_deadline_misses=node.loop_misses,
        refused_messages=sum(node.refused.values()),
        shield_counters={k: v for k, v in node.shield.counters.rules.items() if v},
    )


def _check_sim_spec(node: PolicyNode) -> None:
    from q2real.hardware import robot_spec

    spec = robot_spec(node.spec.name)
    trained = node.bundle.info.metadata["robot"]["sha256"]
    if spec.sha256 != trained:
        print(
            f"warning: hardware/{spec.name} changed since the bundle was trained (spec+model sha256 "
            f"{spec.sha256[:12]} vs {trained[:12]}); the sim robot runs the current files",
            file=sys.stderr,
        )


def _wait_for_enter(node: PolicyNode) -> None:
    sys.stdin.readline()
    node.start()


def _print_status(node: PolicyNode, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        print(_status_line(node), flush=True)


def _status_line(node: PolicyNode) -> str:
    report = node.diagnostics()["values"]
    return (
        f"{time.strftime('%H:%M:%S')}  mode {report['mode']:<7} ticks {report['ticks']:>6}  "
        f"latency p50 {report['latency_p50_ms']} ms p99 {report['latency_p99_ms']} ms  "
        f"loop misses {report['loop_deadline_misses']}  refused {report['refused_messages']}"
    )
