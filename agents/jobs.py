"""Which training job a preset and overrides describe, read before any config class is chosen."""

from __future__ import annotations

from q2real.agents.registry import OTHER_JOBS, JobKind
from q2real.configs.loader import parse_overrides, read_preset


def job_kind(preset: str | None, overrides: list[str]) -> JobKind:
    """The job `algo` chooses: its own where it names one (`OTHER_JOBS`: `stream` for algo=stream_ac,
    `bc` for algo=bc), otherwise the off-policy loop of the learners in `LEARNERS`: `residual` with a
    `residual` section (residual RL or RL from demonstrations), else `rl`. A name that is neither is left
    to the training config, which refuses it naming the learners."""
    data = read_preset(preset)[1] if preset is not None else {}
    data = data if isinstance(data, dict) else {}
    parsed = parse_overrides(overrides)
    algo = parsed.get("algo", data.get("algo"))
    if isinstance(algo, str) and algo in OTHER_JOBS:
        return OTHER_JOBS[algo]
    return "residual" if "residual" in parsed or "residual" in data else "rl"
