"""Which training job a preset and overrides describe, read before any config class is chosen."""

from __future__ import annotations

from typing import Literal

from q2real.configs.loader import parse_overrides, read_preset

JobKind = Literal["rl", "stream", "bc", "residual"]


def job_kind(preset: str | None, overrides: list[str]) -> JobKind:
    """`bc` (algo=bc), `stream` (algo=stream_ac, the streaming learner), `residual` (a `residual`
    section: residual RL or RL from demonstrations) or `rl` (the off-policy learners)."""
    data = read_preset(preset)[1] if preset is not None else {}
    data = data if isinstance(data, dict) else {}
    parsed = parse_overrides(overrides)
    algo = parsed.get("algo", data.get("algo"))
    if algo == "bc":
        return "bc"
    if algo == "stream_ac":
        return "stream"
    return "residual" if "residual" in parsed or "residual" in data else "rl"
