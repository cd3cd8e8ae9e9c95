"""Batch-1 inference latency of a policy bundle in onnxruntime against the same actor in eager torch,
and the node's per-tick call (`PolicyBundle.act`) through ONNX Runtime against the compiled graph.

All run single-threaded in one process, one after the other, on the default task's policy
(`q2real train`'s SAC actor for pendulum_swingup) and on a FlashSAC actor; latency does not depend
on the weights, so untrained networks of the trained shapes are used. The node's call is timed back
to back and with a 2 ms sleep before each call, as a 500 Hz node runs it: after sleeping, caches
are cold, and that is the latency a robot sees. Prints a table, writes
bench/results/policy_latency.json and prints the same JSON as its last line.
Headline keys: onnx_p99_us (default policy), torch_over_onnx_p99, compiled_p50_us_sleeping,
onnx_over_compiled_p50_sleeping.

Results: docs/results/deploy-loop.md
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from q2real.agents.config import TrainConfig
from q2real.agents.export import DeployPolicy, write_bundle
from q2real.agents.learners import build_agent
from q2real.configs.loader import load
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.sim import make

RESULTS = Path(__file__).resolve().parent / "results"


def percentiles(call, obs, calls: int, sleep: float = 0.0) -> tuple[float, float]:
    samples = np.empty(calls)
    for i in range(calls):
        if sleep:
            time.sleep(sleep)
        start = time.perf_counter_ns()
        call(obs)
        samples[i] = time.perf_counter_ns() - start
    return float(np.percentile(samples, 50) / 1e3), float(np.percentile(samples, 99) / 1e3)


def measure(overrides: list[str], calls: int, tmp: Path) -> dict[str, float]:
    config = load(TrainConfig, None, overrides)
    env = make(config.env, num_envs=1, device="cpu")
    agent = build_agent(config, env).eval()
    path = write_bundle(config, env, agent, 0, tmp / f"{config.algo}.onnx")
    bundle = PolicyBundle(path)
    compiled = PolicyBundle(path, runtime="compiled")
    policy = DeployPolicy(agent, env)
    env.close()
    obs = np.random.default_rng(0).normal(size=(1, bundle.info.obs_dim)).astype(np.float32)
    obs_t = torch.from_numpy(obs)

    def run_torch(x):
        with torch.inference_mode():
            return policy(x)

    for _ in range(500):
        bundle(obs)
        run_torch(obs_t)
    onnx_p50, onnx_p99 = percentiles(bundle, obs, calls)
    torch_p50, torch_p99 = percentiles(run_torch, obs_t, calls)
    ticks = {}
    for name, runner in (("onnx_act", bundle), ("compiled_act", compiled)):
        ticks[f"{name}_p50_us"], ticks[f"{name}_p99_us"] = percentiles(runner.act, obs, calls)
        sleeping = percentiles(runner.act, obs, calls // 10, sleep=0.002)
        ticks[f"{name}_p50_us_sleeping"], ticks[f"{name}_p99_us_sleeping"] = sleeping
    return ticks | {
        "onnx_p50_us": onnx_p50,
        "onnx_p99_us": onnx_p99,
        "torch_p50_us": torch_p50,
        "torch_p99_us": torch_p99,
        "torch_over_onnx_p99": torch_p99 / onnx_p99,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = {"default (SAC 256x256, pendulum_swingup)": [], "flashsac (pendulum_swingup)": ["algo=flashsac"]}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in cases.items():
            rows[name] = measure(overrides, args.calls, Path(tmp))
    print(f"\nbatch-1 latency over {args.calls} calls each (us)")
    print(f"{'policy':<42}{'ORT p50':>10}{'ORT p99':>10}{'torch p50':>11}{'torch p99':>11}{'torch/ORT p99':>15}")
    for name, r in rows.items():
        print(
            f"{name:<42}{r['onnx_p50_us']:>10.1f}{r['onnx_p99_us']:>10.1f}{r['torch_p50_us']:>11.1f}"
            f"{r['torch_p99_us']:>11.1f}{r['torch_over_onnx_p99']:>15.2f}"
        )
    asleep = args.calls // 10
    print(f"\nthe node's call (PolicyBundle.act, p50 / p99 us), back to back and after 2 ms asleep ({asleep} calls)")
    print(f"{'policy':<42}{'ORT':>16}{'compiled':>16}{'ORT asleep':>16}{'compiled asleep':>18}")
    for name, r in rows.items():
        cells = [
            f"{r[f'{k}_p50_us{s}']:.1f} / {r[f'{k}_p99_us{s}']:.1f}"
            for s in ("", "_sleeping")
            for k in ("onnx_act", "compiled_act")
        ]
        print(f"{name:<42}{cells[0]:>16}{cells[1]:>16}{cells[2]:>16}{cells[3]:>18}")
    default = rows["default (SAC 256x256, pendulum_swingup)"]
    result = {
        "onnx_p99_us": round(default["onnx_p99_us"], 2),
        "torch_over_onnx_p99": round(default["torch_over_onnx_p99"], 2),
        "compiled_p50_us_sleeping": round(default["compiled_act_p50_us_sleeping"], 2),
        "onnx_over_compiled_p50_sleeping": round(
            default["onnx_act_p50_us_sleeping"] / default["compiled_act_p50_us_sleeping"], 2
        ),
        "calls": args.calls,
        "rows": {k: {m: round(v, 2) for m, v in r.items()} for k, r in rows.items()},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "policy_latency.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
