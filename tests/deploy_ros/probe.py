"""A stand-in robot that times a node's answers: how a control computer is checked before the robot.

The probe publishes `sensor_msgs/JointState` at a fixed rate, as a joint_state_broadcaster does,
and stamps when each command comes back on the controller's topic. A state whose first command does
not arrive within 0.95 of a period is *lost*: the controller would have run that cycle on the
previous command. Arrivals are stamped on the DDS thread that delivers them and matched to states
afterwards, so the probe's own scheduling never turns an answered state into a lost one.

`echo` is the peer to compare with: a process that answers each state at once with a prebuilt
command, the floor that the middleware and Python leave on the machine. `busy_neighbour` is the
load a robot computer really has: a CPU-bound process, like a learner beside the node.

The real-time tests time the node with it, and `bench/deploy_loop.py` measures a machine with it
(imported by path, as a bench script runs from the repository root); the echo runs it as a script.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from q2real.deploy_ros.transport import messages as msg
from q2real.deploy_ros.transport.dds import SENSOR_QOS, Endpoints, use_loopback, wait_for_match

COMMANDS = "/forward_command_controller/commands"
ANSWER_WINDOW = 0.95
"""Fraction of a period within which a command must follow its state to count as answered."""

BUSY_LOOP = "import numpy as np\na = np.random.rand(256, 256)\nwhile True:\n    a = a @ a\n    a /= np.abs(a).max()\n"


@dataclass
class ProbeResult:
    rate: float
    sent: np.ndarray
    """time.monotonic() of each measured state."""
    latency: np.ndarray
    """Seconds from each state to its first command; inf where the state was lost."""
    arrivals: np.ndarray
    """time.monotonic() of every command received while measuring."""

    @property
    def lost(self) -> int:
        return int(np.isinf(self.latency).sum())

    @property
    def lost_fraction(self) -> float:
        return self.lost / max(self.latency.size, 1)

    def row(self) -> dict[str, float | int | None]:
        """Milliseconds; `p99_ms` counts lost states as infinitely late (None when that makes it
        infinite), `answered_p99_ms` is over answered states only."""
        period = 1.0 / self.rate
        answered = self.latency[np.isfinite(self.latency)] * 1e3
        everything = np.percentile(self.latency * 1e3, 99) if self.latency.size else math.nan
        jitter = np.abs(np.diff(self.arrivals) - period) * 1e3 if self.arrivals.size > 1 else np.array([math.nan])

        def ms(value: float) -> float | None:
            return round(float(value), 3) if math.isfinite(value) else None

        return {
            "states": int(self.latency.size),
            "lost": self.lost,
            "lost_fraction": round(self.lost_fraction, 5),
            "p50_ms": ms(np.percentile(self.latency * 1e3, 50)) if self.latency.size else None,
            "p99_ms": ms(everything),
            "answered_p50_ms": ms(np.percentile(answered, 50)) if answered.size else None,
            "answered_p99_ms": ms(np.percentile(answered, 99)) if answered.size else None,
            "answered_max_ms": ms(answered.max()) if answered.size else None,
            "jitter_p99_ms": ms(np.percentile(jitter, 99)),
        }


def match(sent: np.ndarray, arrivals: np.ndarray, period: float) -> np.ndarray:
    """Per state, seconds to the first command that arrived after it and before the next state, if
    that was within the answer window; inf otherwise."""
    latency = np.full(sent.size, np.inf)
    if not sent.size or not arrivals.size:
        return latency
    follows = np.searchsorted(sent, arrivals, side="right") - 1
    valid = follows >= 0
    states, first = np.unique(follows[valid], return_index=True)
    delay = arrivals[valid][first] - sent[states]
    answered = delay < ANSWER_WINDOW * period
    latency[states[answered]] = delay[answered]
    return latency


def match_ticks(
    sent: np.ndarray, arrivals: np.ndarray, arrived: np.ndarray, ready: np.ndarray, period: float
) -> np.ndarray:
    """`match` made exact with the node's own tick stamps (`q2real deploy --timings`, the same clock):
    a state is answered by the command of the tick that consumed it (the first command to arrive after
    that tick's command was ready: the probe may receive it before the node's write returns), so a
    node answering every state one period late, or a fallback tick that never saw the state, counts
    as lost instead of passing as the next state's quick answer."""
    latency = np.full(sent.size, np.inf)
    consumed = np.searchsorted(sent, arrived, side="right") - 1  # the state each tick took
    valid = (consumed >= 0) & np.isfinite(arrived) & np.isfinite(ready)
    states, first = np.unique(consumed[valid], return_index=True)
    answer = np.searchsorted(arrivals, ready[valid][first], side="left")
    got = answer < arrivals.size
    delay = arrivals[answer[got]] - sent[states[got]]
    answered = delay < ANSWER_WINDOW * period
    latency[states[got][answered]] = delay[answered]
    return latency


def lost_causes(
    result: ProbeResult, arrived: np.ndarray | None = None, began: np.ndarray | None = None
) -> dict[str, int]:
    """Why each lost state was lost, so that a loss count says whose it is. For either peer,
    `probe_late`: the probe itself sent the state over a quarter period behind its own schedule.
    With the node's tick stamps (`arrived`, `began`, as `match_ticks`), each lost state is one of:
    `late` (a tick took it; its command came after the window or never), `older` (the node ticked
    while it was current, but on an older state: it had not arrived when the slot's deadline passed)
    and `no_tick` (the node did not tick while it was current: a stall, or a schedule off the stream's
    phase)."""
    period = 1.0 / result.rate
    sent = result.sent
    lost = np.flatnonzero(np.isinf(result.latency))
    grid = np.arange(sent.size) * period
    behind = sent - grid - np.median(sent - grid)  # the probe sleeps to a fixed grid; its phase, robustly
    causes = {"probe_late": int((behind[lost] > 0.25 * period).sum())}
    if arrived is None or began is None:
        return causes
    taken = np.searchsorted(sent, arrived[np.isfinite(arrived)], side="right") - 1
    consumed = np.isin(lost, taken)
    current_until = np.append(sent[1:], sent[-1] + period)[lost]
    ticked = np.searchsorted(began, current_until) > np.searchsorted(began, sent[lost])
    causes["late"] = int(consumed.sum())
    causes["older"] = int((~consumed & ticked).sum())
    causes["no_tick"] = int((~consumed & ~ticked).sum())
    return causes


def rate_ratio_interval(
    lost: int, states: int, peer_lost: int, peer_states: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Exact interval for the ratio of two loss rates from their counts (losses as rare, independent
    events: given the total, one side's count is binomial; Clopper-Pearson on its share). A ratio of
    12 losses to 2 is mostly counting noise; this says how much. (0, inf) when neither side lost any."""
    total = lost + peer_lost
    if total == 0:
        return 0.0, math.inf
    tail = (1 - confidence) / 2
    log_binomial = [math.lgamma(total + 1) - math.lgamma(i + 1) - math.lgamma(total - i + 1) for i in range(total + 1)]

    def share(at_least: bool) -> float:
        # The share p at which seeing `lost` (or more / or fewer) of `total` has probability `tail`.
        low, high = 0.0, 1.0
        for _ in range(50):  # p stays strictly inside (0, 1)
            p = (low + high) / 2
            k = range(lost, total + 1) if at_least else range(0, lost + 1)
            log_p, log_q = math.log(p), math.log1p(-p)
            mass = sum(math.exp(log_binomial[i] + i * log_p + (total - i) * log_q) for i in k)
            if (mass < tail) == at_least:
                low = p
            else:
                high = p
        return (low + high) / 2

    p_low = share(True) if lost > 0 else 0.0
    p_high = share(False) if lost < total else 1.0
    exposure = peer_states / states

    def ratio(p: float) -> float:
        return math.inf if p >= 1.0 else p / (1 - p) * exposure

    return ratio(p_low), ratio(p_high)


def probe(
    rate: float,
    seconds: float,
    warmup: float = 3.0,
    joints: tuple[str, ...] = ("hinge",),
    commands: str = COMMANDS,
    match_timeout: float = 30.0,
) -> ProbeResult:
    """Publish joint states at `rate` (small motions around zero) and time the commands."""
    endpoints = Endpoints(node="q2real_probe")
    try:
        writer = endpoints.writer("/joint_states", msg.JointState)
        arrivals: list[float] = []
        endpoints.reader(commands, msg.Float64MultiArray, lambda _m: arrivals.append(time.monotonic()))
        wait_for_match(writer, timeout=match_timeout)
        period = 1.0 / rate
        steps = int(round((warmup + seconds) * rate))
        sent = np.zeros(steps)
        zeros = [0.0] * len(joints)
        nan = [math.nan] * len(joints)
        start = time.monotonic()
        for step in range(steps):
            angle = 0.05 * math.sin(math.pi * step * period)
            sent[step] = time.monotonic()
            writer.write(msg.JointState(name=list(joints), position=[angle] * len(joints), velocity=zeros, effort=nan))
            delay = start + (step + 1) * period - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        time.sleep(2 * period)  # the last state's answer
    finally:
        endpoints.close()
    first = int(round(warmup * rate))
    measured = sent[first:]
    got = np.array(arrivals)
    got = got[got >= measured[0]] if measured.size else got[:0]
    return ProbeResult(rate, measured, match(measured, got, period), got)


def echo(seconds: float, commands: str = COMMANDS) -> None:
    """Answer every joint state with a one-joint command at once, for `seconds`."""
    endpoints = Endpoints(node="q2real_echo")
    try:
        writer = endpoints.writer(commands, msg.Float64MultiArray)
        answer = msg.Float64MultiArray(data=[0.0])
        endpoints.reader("/joint_states", msg.JointState, lambda _m: writer.write(answer), SENSOR_QOS)
        time.sleep(seconds)
    finally:
        endpoints.close()


def busy_neighbour() -> subprocess.Popen:
    """A CPU-bound process (single-threaded matrix products, as a learner beside the node); the caller
    terminates it."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", BUSY_LOOP], env=env)


def main() -> None:
    """`python tests/deploy_ros/probe.py --echo SECONDS`: the echo peer as its own process."""
    import argparse

    parser = argparse.ArgumentParser(description="the echo peer: answer every joint state at once")
    parser.add_argument("--echo", type=float, required=True, metavar="SECONDS")
    args = parser.parse_args()
    use_loopback()
    echo(args.echo)


if __name__ == "__main__":
    main()
