"""Prioritized replay cost: our device sum tree against uniform sampling and against cpprb.

One storage of 1M transitions (1024 envs x 1024 rows, obs 17, action 6: HalfCheetah-sized) with
random priorities; for batch sizes 256 and 4096, each sampler draws batches (transitions gathered,
1-step targets) and, for the prioritized ones, writes the batch's new priorities back. cpprb's
PrioritizedReplayBuffer (C++ segment tree, numpy out) holds the same 1M transitions and does the same.
Times are medians of repeated calls in one process, 1 torch thread, after warm-up.

Prints a table, writes bench/results/replay_sampling.json and prints the same JSON as its last line.
Headline keys: prioritized_over_uniform_cost (worst case over batch sizes, time per batch),
ours_over_reference_speed (worst case, sampled transitions/s ours / cpprb).

Results: docs/results/speed.md
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from q2real.agents.common.replay import ReplayStorage
from q2real.agents.common.samplers import PrioritizedSampler, SamplerConfig, UniformSampler

RESULTS = Path(__file__).resolve().parent / "results"
ENVS, ROWS, OBS, ACT = 1024, 1024, 17, 6


def timed(call, repeats: int) -> float:
    for _ in range(5):
        call()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def ours() -> tuple[ReplayStorage, UniformSampler, PrioritizedSampler]:
    storage = ReplayStorage(ENVS * ROWS, ENVS, OBS, ACT, torch.device("cpu"))
    for value in storage.data.values():
        if value.dtype == torch.bool:
            value.copy_(torch.rand(value.shape) < 0.001)
        else:
            value.copy_(torch.randn(value.shape))
    storage.cursor[0], storage.cursor[1] = 0, ROWS
    prioritized = PrioritizedSampler(SamplerConfig(kind="prioritized"), storage)
    slots = torch.arange(ENVS * ROWS)
    p = torch.rand(ENVS * ROWS, dtype=torch.float64) + 0.01
    prioritized.priority.set(slots, p)
    prioritized.inverse.set(slots, 1 / p)
    return storage, UniformSampler(), prioritized


def reference():
    from cpprb import PrioritizedReplayBuffer

    size = ENVS * ROWS
    buffer = PrioritizedReplayBuffer(
        size, {"obs": {"shape": OBS}, "act": {"shape": ACT}, "rew": {}, "next_obs": {"shape": OBS}, "done": {}}
    )
    rng = np.random.default_rng(0)
    chunk = 65536
    for _ in range(size // chunk):
        buffer.add(
            obs=rng.standard_normal((chunk, OBS), dtype=np.float32),
            act=rng.standard_normal((chunk, ACT), dtype=np.float32),
            rew=rng.standard_normal(chunk, dtype=np.float32),
            next_obs=rng.standard_normal((chunk, OBS), dtype=np.float32),
            done=np.zeros(chunk, dtype=np.float32),
            priorities=rng.random(chunk) + 0.01,
        )
    return buffer


def main() -> None:
    torch.set_num_threads(1)
    storage, uniform, prioritized = ours()
    buffer = reference()
    rows = []
    for batch_size in (256, 4096):
        repeats = 400 if batch_size == 256 else 100
        t_uniform = timed(lambda b=batch_size: uniform.sample(storage, b, 1, 0.99, 1), repeats)
        t_prior = timed(lambda b=batch_size: prioritized.sample(storage, b, 1, 0.99, 1), repeats)
        batch = prioritized.sample(storage, batch_size, 1, 0.99, 1)
        td = torch.rand(batch_size)
        t_update = timed(lambda b=batch, d=td: prioritized.update(b, d), repeats)
        t_ref = timed(lambda b=batch_size: buffer.sample(b), repeats)
        ref_batch = buffer.sample(batch_size)
        ref_td = np.random.default_rng(1).random(batch_size) + 0.01
        t_ref_update = timed(lambda i=ref_batch["indexes"], d=ref_td: buffer.update_priorities(i, d), repeats)
        rows.append(
            {
                "batch": batch_size,
                "uniform_ms": t_uniform * 1e3,
                "prioritized_ms": t_prior * 1e3,
                "update_ms": t_update * 1e3,
                "cpprb_sample_ms": t_ref * 1e3,
                "cpprb_update_ms": t_ref_update * 1e3,
                "prioritized_samples_per_s": batch_size / t_prior,
                "priority_updates_per_s": batch_size / t_update,
                "cpprb_samples_per_s": batch_size / t_ref,
                "cpprb_updates_per_s": batch_size / t_ref_update,
            }
        )
    print(f"replay of {ENVS * ROWS:,} transitions (obs {OBS}, action {ACT}); median ms per batch, 1 thread")
    header = f"{'batch':>6} {'uniform':>8} {'ours PER':>9} {'ours upd':>9} {'cpprb PER':>10} {'cpprb upd':>10}"
    print(header + f" {'PER/uniform':>11} {'ours/cpprb speed':>16}")
    for r in rows:
        print(
            f"{r['batch']:>6} {r['uniform_ms']:>8.3f} {r['prioritized_ms']:>9.3f} {r['update_ms']:>9.3f} "
            f"{r['cpprb_sample_ms']:>10.3f} {r['cpprb_update_ms']:>10.3f} "
            f"{r['prioritized_ms'] / r['uniform_ms']:>11.2f} {r['cpprb_sample_ms'] / r['prioritized_ms']:>16.2f}"
        )
    result = {
        "prioritized_over_uniform_cost": round(max(r["prioritized_ms"] / r["uniform_ms"] for r in rows), 3),
        "ours_over_reference_speed": round(min(r["cpprb_sample_ms"] / r["prioritized_ms"] for r in rows), 3),
        "ours_over_reference_update_speed": round(min(r["cpprb_update_ms"] / r["update_ms"] for r in rows), 3),
        "rows": [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "replay_sampling.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
