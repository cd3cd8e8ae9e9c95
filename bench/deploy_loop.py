"""Observation-to-command latency and tick jitter of the deploy node over DDS loopback.

This process plays the robot: every period it publishes a `sensor_msgs/JointState` (pendulum hinge)
on `rt/joint_states` and times how long until the node's command comes back on
`rt/forward_command_controller/commands` (one state -> one command: the node ticks on fresh states).
The node runs as its own process (`q2real deploy`, the default policy's network, shield in RUN).
Side by side, the same robot loop runs against a bare echo process that answers every joint state
with a command at once: the floor that Cyclone DDS and Python leave on this machine. Jitter is the
deviation of the command inter-arrival time from the period, as the robot sees it.

Rates: the task's control rate (50 Hz) and 500 Hz. Prints a table, writes
bench/results/deploy_loop.json and prints the same JSON as its last line.
Headline key: latency_p99_ms_500hz.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from q2real.deploy_ros import messages as msg
from q2real.deploy_ros.dds import SENSOR_QOS, Endpoints, use_loopback, wait_for_match

RESULTS = Path(__file__).resolve().parent / "results"
COMMANDS = "/forward_command_controller/commands"


def echo(seconds: float) -> None:
    """The peer: answer each joint state with a one-joint command, nothing else."""
    endpoints = Endpoints(node="echo")
    writer = endpoints.writer(COMMANDS, msg.Float64MultiArray)
    answer = msg.Float64MultiArray(data=[0.0])
    endpoints.reader("/joint_states", msg.JointState, lambda m: writer.write(answer), SENSOR_QOS)
    time.sleep(seconds)
    endpoints.close()


def robot_loop(rate: float, seconds: float, warmup: float) -> dict[str, float]:
    """Publish states at `rate` and time each command's return."""
    endpoints = Endpoints(node="bench_robot")
    writer = endpoints.writer("/joint_states", msg.JointState)
    arrived = threading.Event()
    arrivals: list[float] = []

    def on_command(_message) -> None:
        arrivals.append(time.monotonic())
        arrived.set()

    endpoints.reader(COMMANDS, msg.Float64MultiArray, on_command)
    wait_for_match(writer, timeout=30)
    period = 1.0 / rate
    latencies, lost = [], 0
    start = next_at = time.monotonic()
    step = 0
    while next_at - start < warmup + seconds:
        angle = 0.05 * np.sin(2 * np.pi * 0.5 * step * period)
        state = msg.JointState(name=["hinge"], position=[angle], velocity=[0.0], effort=[float("nan")])
        arrived.clear()
        sent = time.monotonic()
        writer.write(state)
        got = arrived.wait(period * 0.95)
        if next_at - start >= warmup:
            if got:
                latencies.append(arrivals[-1] - sent)
            else:  # no answer within the period: counted at infinite latency, not dropped
                latencies.append(np.inf)
                lost += 1
        step += 1
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    endpoints.close()
    intervals = np.diff([t for t in arrivals if t - start >= warmup])
    lat = np.array(latencies) * 1e3
    jitter = np.abs(intervals - period) * 1e3
    return {
        "samples": int(lat.size),
        "late_or_lost": lost,
        "latency_p50_ms": float(np.percentile(lat, 50)),
        "latency_p99_ms": float(np.percentile(lat, 99)),
        "latency_max_ms": float(lat[np.isfinite(lat)].max()),
        "jitter_p50_ms": float(np.percentile(jitter, 50)),
        "jitter_p99_ms": float(np.percentile(jitter, 99)),
    }


def node_process(bundle: Path, rate: float, seconds: float) -> subprocess.Popen:
    overrides = [f"control_period={1.0 / rate}", "autostart=true", "shield.ramp_time=0.05", "startup_timeout=30"]
    command = [sys.executable, "-m", "q2real.cli.main", "deploy", str(bundle), "--duration", str(seconds)]
    return subprocess.Popen(command + overrides, stdout=subprocess.DEVNULL)


def default_bundle(directory: Path) -> Path:
    """The default job's network (SAC, pendulum); latency does not depend on the weights."""
    from q2real.agents.config import TrainConfig
    from q2real.agents.export import write_bundle
    from q2real.agents.learners import build_agent
    from q2real.sim import make

    config = TrainConfig()
    env = make(config.env, num_envs=1, device="cpu")
    try:
        return write_bundle(config, env, build_agent(config, env), 0, directory / "policy.onnx")
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per rate and peer")
    parser.add_argument("--bundle", type=Path, help="policy bundle (default: the default job's network)")
    parser.add_argument("--echo", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    use_loopback()
    if args.echo:
        echo(args.echo)
        return
    os.environ.setdefault("ROS_DOMAIN_ID", "77")
    warmup = 3.0
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or default_bundle(Path(tmp))
        for rate in (50.0, 500.0):
            for peer in ("q2real node", "bare echo"):
                total = warmup + args.seconds + 5
                if peer == "q2real node":
                    process = node_process(bundle, rate, total)
                else:
                    process = subprocess.Popen([sys.executable, __file__, "--echo", str(total)])
                try:
                    rows[(rate, peer)] = robot_loop(rate, args.seconds, warmup)
                finally:
                    process.terminate()
                    process.wait(30)
    header = f"{'rate':>6} {'peer':<12} {'samples':>7} {'lost':>5} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
    print(header + f"{'jitter p50':>10} {'jitter p99':>10}")
    print("(lost = no command within 0.95 period; counted as infinite latency in the percentiles)")
    for (rate, peer), r in rows.items():
        print(
            f"{rate:>6g} {peer:<12} {r['samples']:>7} {r['late_or_lost']:>5} {r['latency_p50_ms']:>7.3f} "
            f"{r['latency_p99_ms']:>7.3f} {r['latency_max_ms']:>7.3f} "
            f"{r['jitter_p50_ms']:>10.3f} {r['jitter_p99_ms']:>10.3f}"
        )
    node500, echo500 = rows[(500.0, "q2real node")], rows[(500.0, "bare echo")]
    result = {
        "latency_p99_ms_500hz": round(node500["latency_p99_ms"], 3),
        "latency_p50_ms_500hz": round(node500["latency_p50_ms"], 3),
        "latency_p99_ms_50hz": round(rows[(50.0, "q2real node")]["latency_p99_ms"], 3),
        "jitter_p99_ms_500hz": round(node500["jitter_p99_ms"], 3),
        "lost_500hz": node500["late_or_lost"],
        "node_over_echo_p99_500hz": round(node500["latency_p99_ms"] / echo500["latency_p99_ms"], 2),
        "echo_latency_p99_ms_500hz": round(echo500["latency_p99_ms"], 3),
        "seconds_per_row": args.seconds,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "deploy_loop.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
