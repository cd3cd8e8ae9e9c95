"""Range checks for config values, shared by every `validate()` so refusals read alike.

Each check raises `ValueError("<key>: expected ..., got ...")`; the config loader prefixes the source
(`command line: shield.damp_kd: ...`). Type checks happen earlier, in the loader; these catch values
of the right type that no robot or learner can use (NaN, infinities, wrong signs, empty ranges).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

ROS_NAME = re.compile(r"(~/|/)?[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*")
"""A ROS 2 topic name: tokens of letters, digits and '_' not starting with a digit, '/'-separated,
optionally absolute or private (`~/`)."""


def number(
    key: str,
    value: float,
    *,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
) -> None:
    """`value` must be finite and inside the given bounds."""
    bounds = [
        f"> {above:g}" if above is not None else "",
        f">= {at_least:g}" if at_least is not None else "",
        f"<= {at_most:g}" if at_most is not None else "",
        f"< {below:g}" if below is not None else "",
    ]
    wanted = " and ".join(b for b in bounds if b)
    try:  # a YAML or JSON integer may have hundreds of digits: too large for a float is not finite
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        ok = False
    if ok:
        ok = (
            (above is None or value > above)
            and (at_least is None or value >= at_least)
            and (at_most is None or value <= at_most)
            and (below is None or value < below)
        )
    if not ok:
        raise ValueError(f"{key}: expected a finite number{' ' + wanted if wanted else ''}, got {value!r:.80}")


def numbers(key: str, values: Iterable[float], **bounds: float) -> None:
    for i, value in enumerate(values):
        number(f"{key}[{i}]", value, **bounds)


def names(key: str, values: Iterable[str]) -> None:
    """Non-empty, printable, distinct names (joints, sites)."""
    seen = set()
    for i, value in enumerate(values):
        if not isinstance(value, str) or not value or not value.isprintable() or len(value) > 256:
            raise ValueError(f"{key}[{i}]: expected a non-empty printable name, got {value!r:.80}")
        if value in seen:
            raise ValueError(f"{key}: '{value}' is listed twice")
        seen.add(value)


def ros_name(key: str, value: str) -> None:
    if not isinstance(value, str) or len(value) > 256 or not ROS_NAME.fullmatch(value):
        raise ValueError(
            f"{key}: expected a ROS 2 name (letters, digits and '_' between '/', optionally starting with "
            f"'/' or '~/'), got {value!r:.80}"
        )


ADDRESS = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})")


def address(key: str, value: str, lowest_port: int = 1) -> tuple[str, int]:
    """HOST:PORT (a name, an IPv4 address or a bracketed IPv6 one) -> (host, port); a server may take
    port 0 (any free one)."""
    match = ADDRESS.fullmatch(value) if isinstance(value, str) and len(value) <= 256 else None
    if match is None or not lowest_port <= int(match.group(1)) <= 65535:
        raise ValueError(
            f"{key}: expected HOST:PORT (port {lowest_port}-65535; IPv6 as [ADDR]:PORT), got {value!r:.80}"
        )
    host = value.rpartition(":")[0]
    return host, int(match.group(1))
