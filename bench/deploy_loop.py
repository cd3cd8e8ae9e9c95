"""Lost ticks and latency of the deploy node over DDS loopback, quiet and beside a busy process.

This process plays the robot (`tests/deploy_ros/probe.py`): every period it publishes a
`sensor_msgs/JointState` (pendulum hinge) and stamps when the node's command comes back. A state
without a command within 0.95 of a period is lost (the controller would reuse the last command).
The node runs as its own process (`q2real deploy`, the default job's network, shield in RUN) and
writes every tick's stage timestamps (`--timings`), so the table can say where the time of the
slowest ticks went. Side by side, the same probe runs against a bare echo process that answers
every state with a prebuilt command at once: the floor Cyclone DDS and Python leave on this machine.
Node and echo alternate in `--rounds` rounds per row (each a share of `--seconds`) and each side's
rounds are pooled, so a ratio compares the two over the same minutes of this machine's drifting
loopback rather than two runs minutes apart.

Rows: 50 Hz (the task's rate), 500 Hz and 1 kHz quiet; 500 Hz beside one CPU-bound process (a
single-threaded matrix loop, as a learner beside the node), and the same with the node's real-time
settings (`realtime.priority=50`, SCHED_FIFO), where the OS allows them. Prints a table, writes
bench/results/deploy_loop.json and prints the same JSON as its last line. Headline keys:
lost_fraction_500hz, lost_fraction_500hz_busy, node_over_echo_p99_500hz, latency_p99_ms_500hz
(null if lost ticks make it infinite; the loss rate beside it says why), node_over_echo_lost_500hz
with its exact 95 % interval from the two loss counts (`_interval`: a ratio of a dozen losses to two
is mostly counting noise), node_minus_echo_p50_ms_500hz. Each lost state is put down to its cause
(`lost_causes`: the probe sending it late, the node's tick taking it late, ticking on an older
state, or not ticking at all while it was current). Node rows match each
state to the command of the tick that consumed it (the node's stamps), so a late answer never passes
for the next state's; echo rows, without stamps, count the first command after each state.

Results: docs/results/deploy-loop.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from q2real.deploy_ros.timing import COLUMN, SPANS
from q2real.deploy_ros.transport.dds import use_loopback

PROBE = Path(__file__).resolve().parents[1] / "tests" / "deploy_ros" / "probe.py"
"""The stand-in robot that times the node, as the real-time tests time it; the echo peer runs it as a script."""
sys.path.insert(0, str(PROBE.parent))

from probe import ProbeResult, busy_neighbour, lost_causes, match_ticks, probe, rate_ratio_interval  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
WARMUP = 3.0
ROWS = [
    # (rate, busy neighbour, node settings beyond the defaults)
    (50.0, False, ()),
    (500.0, False, ()),
    (1000.0, False, ()),
    (500.0, True, ()),
    (500.0, True, ("realtime.priority=50",)),
]


def node_process(bundle: Path, rate: float, seconds: float, timings: Path, extra: tuple[str, ...]) -> subprocess.Popen:
    overrides = [f"control_period={1.0 / rate}", "autostart=true", "shield.ramp_time=0.05", "startup_timeout=30"]
    command = [sys.executable, "-m", "q2real.cli.main", "deploy", str(bundle), "--duration", str(seconds)]
    command += ["--timings", str(timings), *overrides, *extra]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL)


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


def where_the_time_went(result: ProbeResult, rows: np.ndarray) -> dict[str, float]:
    """Mean milliseconds per stage over the slowest 1 % of states (lost ones first): wire in
    (probe -> node), the node's spans up to the command being ready, and send (serialization, the
    write and the wire back to the probe). `rows`: the node's tick stamps (`--timings`)."""
    rows = rows[np.isfinite(rows[:, COLUMN["arrived"]])]
    if not rows.size:
        return {}
    arrived = rows[:, COLUMN["arrived"]]
    # Each state's tick: the first the node took on a state that arrived after it was sent.
    tick = np.searchsorted(arrived, result.sent, side="left")
    ok = tick < len(rows)
    worst = np.argsort(-np.where(np.isinf(result.latency), 1e9, result.latency))[: max(1, result.sent.size // 100)]
    worst = worst[ok[worst]]
    picked = rows[tick[worst]]
    out = {"wire_in": float(np.nanmean(picked[:, COLUMN["arrived"]] - result.sent[worst]) * 1e3)}
    for name, (a, b) in SPANS.items():
        if name not in ("total", "publish"):
            out[name] = float(np.nanmean(picked[:, COLUMN[b]] - picked[:, COLUMN[a]]) * 1e3)
    answered = np.isfinite(result.latency[worst])
    if answered.any():
        back = result.sent[worst][answered] + result.latency[worst][answered]
        out["send"] = float(np.nanmean(back - picked[answered, COLUMN["shielded"]]) * 1e3)
    return {k: round(v, 3) for k, v in out.items()}


def stage_costs(ticks: np.ndarray) -> dict[str, dict[str, float]]:
    """p50 and p99 milliseconds of each of the node's stages over every tick where it happened."""
    out = {}
    for name, (a, b) in SPANS.items():
        span = (ticks[:, COLUMN[b]] - ticks[:, COLUMN[a]]) * 1e3
        span = span[np.isfinite(span)]
        if span.size:
            out[name] = {
                "p50": round(float(np.percentile(span, 50)), 4),
                "p99": round(float(np.percentile(span, 99)), 4),
            }
    return out


def lost_ratio(node: dict, echo: dict) -> float | None:
    """The node's lost fraction over the echo's: 1.0 when neither lost a state, None (unbounded) when
    only the echo lost none."""
    if echo["lost"] == 0:
        return 1.0 if node["lost"] == 0 else None
    return round(node["lost_fraction"] / echo["lost_fraction"], 2)


def lost_ratio_interval(node: dict, echo: dict) -> list[float | None]:
    """95 % interval of `lost_ratio` from the two loss counts (None: unbounded)."""
    low, high = rate_ratio_interval(node["lost"], node["states"], echo["lost"], echo["states"])
    return [round(v, 2) if np.isfinite(v) else None for v in (low, high)]


@dataclass
class Part:
    """One round of one row against one peer: what the probe saw, and for the node its tick stamps and
    the states the plain answer window called lost."""

    result: ProbeResult
    ticks: np.ndarray | None = None
    window_lost: int = 0


def run_part(
    bundle: Path, rate: float, busy: bool, extra: tuple[str, ...], peer: str, seconds: float, tmp: Path
) -> Part | str:
    """One round; a string says why the node refused to start (e.g. SCHED_FIFO denied)."""
    total = WARMUP + seconds + 8
    timings = tmp / f"timings_{rate:g}_{busy}_{len(extra)}.csv"
    timings.unlink(missing_ok=True)
    neighbour = busy_neighbour() if busy else None
    if peer == "node":
        process = node_process(bundle, rate, total, timings, extra)
    else:
        process = subprocess.Popen([sys.executable, str(PROBE), "--echo", str(total)])
    try:
        result = probe(rate, seconds, WARMUP)
    except TimeoutError:
        if process.poll() not in (None, 0):
            return f"the node exited with {process.returncode} (see its stderr above)"
        raise
    finally:
        for child in (process, neighbour):
            if child is not None:
                child.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(30)
    if peer != "node" or not timings.exists():
        return Part(result)
    # Matched through the node's own tick stamps: a late answer cannot pass for the next state's.
    ticks = np.loadtxt(timings, delimiter=",", skiprows=1, ndmin=2)
    exact = match_ticks(
        result.sent, result.arrivals, ticks[:, COLUMN["arrived"]], ticks[:, COLUMN["shielded"]], 1.0 / rate
    )
    return Part(ProbeResult(result.rate, result.sent, exact, result.arrivals), ticks, result.lost)


def pooled(parts: list[Part]) -> dict:
    """One row over every round (they ran one after another, so times stay in order)."""
    first = parts[0].result
    result = ProbeResult(
        first.rate,
        np.concatenate([p.result.sent for p in parts]),
        np.concatenate([p.result.latency for p in parts]),
        np.concatenate([p.result.arrivals for p in parts]),
    )
    row = result.row()
    causes: dict[str, int] = {}
    for part in parts:
        ticks = part.ticks
        stamps = (None, None) if ticks is None else (ticks[:, COLUMN["arrived"]], ticks[:, COLUMN["began"]])
        for cause, count in lost_causes(part.result, *stamps).items():
            causes[cause] = causes.get(cause, 0) + count
    row["lost_causes"] = causes  # type: ignore[assignment]
    stamped = [p.ticks for p in parts if p.ticks is not None]
    if stamped:
        ticks = np.concatenate(stamped)
        row["lost_by_window"] = sum(p.window_lost for p in parts)
        row["slowest_1pct_ms"] = where_the_time_went(result, ticks)  # type: ignore[assignment]
        row["stage_ms"] = stage_costs(ticks)  # type: ignore[assignment]
    return row


def label(busy: bool, extra: tuple[str, ...]) -> str:
    return ("busy" if busy else "quiet") + (" + " + " ".join(extra) if extra else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per row")
    parser.add_argument("--rounds", type=int, default=3, help="node and echo alternate this many times per row")
    parser.add_argument("--bundle", type=Path, help="policy bundle (default: the default job's network)")
    parser.add_argument("--rows", type=int, nargs="*", help=argparse.SUPPRESS)  # indices into ROWS, to iterate
    args = parser.parse_args()
    use_loopback()
    os.environ.setdefault("ROS_DOMAIN_ID", "77")
    rows: dict[tuple, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or default_bundle(Path(tmp))
        for i, (rate, busy, extra) in enumerate(ROWS):
            if args.rows and i not in args.rows:
                continue
            # The node's settings have no echo counterpart.
            peers = ("node",) if extra else ("node", "echo")
            parts: dict[str, list[Part]] = {peer: [] for peer in peers}
            refused = ""
            # Node and echo alternate, round by round: this machine's loopback drifts over minutes, and
            # a ratio of two runs minutes apart would measure the drift.
            for _ in range(args.rounds):
                for peer in peers:
                    part = run_part(bundle, rate, busy, extra, peer, args.seconds / args.rounds, Path(tmp))
                    if isinstance(part, str):
                        refused = part
                        break
                    parts[peer].append(part)
                if refused:
                    break
            for peer in peers:
                key = (rate, label(busy, extra), peer)
                rows[key] = {"refused": refused} if refused else pooled(parts[peer])
    print(f"{'rate':>6} {'load':<30} {'peer':<5} {'states':>6} {'lost':>5} {'lost %':>7} {'p99 ms':>7} ", end="")
    print(f"{'answered p50':>12} {'p99':>6} {'max':>6}")
    for (rate, load, peer), r in rows.items():
        if "refused" in r:
            print(f"{rate:>6g} {load:<30} {peer:<5} {r['refused']}")
            continue
        p99 = "inf" if r["p99_ms"] is None else f"{r['p99_ms']:.3f}"
        print(
            f"{rate:>6g} {load:<30} {peer:<5} {r['states']:>6} {r['lost']:>5} {100 * r['lost_fraction']:>7.3f} "
            f"{p99:>7} {r['answered_p50_ms']:>12.3f} {r['answered_p99_ms']:>6.3f} {r['answered_max_ms']:>6.3f}"
        )
    print("(lost = no command within 0.95 period; p99 counts lost states as infinitely late)")
    print("\nthe node's stages over every tick (p50 / p99 ms):")
    for (rate, load, peer), r in rows.items():
        if peer == "node" and r.get("stage_ms"):
            print(
                f"{rate:>6g} {load:<30} "
                + "  ".join(f"{k} {v['p50']:.3f}/{v['p99']:.3f}" for k, v in r["stage_ms"].items())
            )
    print("\nwhere the slowest 1 % of the node's states spent their time (mean ms):")
    for (rate, load, peer), r in rows.items():
        if peer == "node" and r.get("slowest_1pct_ms"):
            print(f"{rate:>6g} {load:<30} " + "  ".join(f"{k} {v:.3f}" for k, v in r["slowest_1pct_ms"].items()))
    print("\nwhy states were lost (probe_late: sent late by the probe; the rest, node rows only, sum to the losses):")
    for (rate, load, peer), r in rows.items():
        if r.get("lost"):
            print(f"{rate:>6g} {load:<30} {peer:<5} " + "  ".join(f"{k} {v}" for k, v in r["lost_causes"].items()))
    if args.rows:
        return
    node, echo = rows[(500.0, "quiet", "node")], rows[(500.0, "quiet", "echo")]
    busy_node = rows[(500.0, "busy", "node")]
    ratio = None
    if node["p99_ms"] is not None and echo["p99_ms"] is not None:
        ratio = round(node["p99_ms"] / echo["p99_ms"], 2)
    for load in ("quiet", "busy"):
        pair = rows[(500.0, load, "node")], rows[(500.0, load, "echo")]
        low, high = lost_ratio_interval(*pair)
        shown = "inf" if high is None else high
        print(f"500 Hz {load}: node over echo, lost {lost_ratio(*pair)} (95 % interval {low} to {shown})")
    result = {
        "lost_fraction_500hz": node["lost_fraction"],
        "lost_fraction_500hz_busy": busy_node["lost_fraction"],
        "echo_lost_fraction_500hz": echo["lost_fraction"],
        "echo_lost_fraction_500hz_busy": rows[(500.0, "busy", "echo")]["lost_fraction"],
        "lost_fraction_500hz_busy_fifo": rows[(500.0, label(True, ROWS[-1][2]), "node")].get("lost_fraction"),
        "lost_fraction_1khz": rows[(1000.0, "quiet", "node")]["lost_fraction"],
        "latency_p99_ms_500hz": node["p99_ms"],
        "answered_p99_ms_500hz": node["answered_p99_ms"],
        "echo_latency_p99_ms_500hz": echo["p99_ms"],
        "node_over_echo_p99_500hz": ratio,
        "node_over_echo_lost_500hz": lost_ratio(node, echo),
        "node_over_echo_lost_500hz_interval": lost_ratio_interval(node, echo),
        "node_minus_echo_p50_ms_500hz": round(node["answered_p50_ms"] - echo["answered_p50_ms"], 3),
        "node_over_echo_lost_500hz_busy": lost_ratio(busy_node, rows[(500.0, "busy", "echo")]),
        "node_over_echo_lost_500hz_busy_interval": lost_ratio_interval(busy_node, rows[(500.0, "busy", "echo")]),
        "stage_ms_500hz": node.get("stage_ms"),
        "latency_p99_ms_50hz": rows[(50.0, "quiet", "node")]["p99_ms"],
        "seconds_per_row": args.seconds,
        "rounds_per_row": args.rounds,
        "rows": {f"{rate:g} Hz {load} {peer}": r for (rate, load, peer), r in rows.items()},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "deploy_loop.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
