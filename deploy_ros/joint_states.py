"""The node's `read` of its robot: joint state messages checked and kept as the newest sample.

Messages that could not have come from the robot the bundle was trained for (wrong lengths, unknown,
repeated or missing joints, non-finite positions or velocities) are refused with a reason and never
stored, so they reach neither the shield nor the command topic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from q2real.contracts.schema import BundleError, brief


@dataclass(frozen=True)
class JointSample:
    position: np.ndarray
    """In `JointStates.joints` order."""
    velocity: np.ndarray
    received: float
    """time.monotonic() when it arrived: freshness is judged on the node's own clock."""


class JointStates:
    """The newest valid joint state of `joints` (the ones the node commands and observes); `allowed`
    names joints a message may also carry."""

    def __init__(self, joints: Sequence[str], allowed: Sequence[str], source: str, robot: str):
        self.joints = tuple(joints)
        self._index = {name: i for i, name in enumerate(self.joints)}
        self._allowed = set(self.joints) | set(allowed)
        self._source, self._robot = source, robot
        self.latest: JointSample | None = None
        self.used: JointSample | None = None
        """The sample the last tick took (`take`)."""
        self.period = math.inf
        """Smoothed seconds between joint states."""
        self._layout: tuple[list[str], np.ndarray, np.ndarray] | None = None
        """The last valid message's joint names, the indices it uses and the rows they fill."""

    def check_robot(self, names: Sequence[str]) -> None:
        """Refuse to run against a robot whose joint states do not match the bundle."""
        missing = [n for n in self.joints if n not in names]
        unknown = [n for n in names if n not in self._allowed]
        if missing or unknown:
            raise BundleError(
                f"{self._source}: the robot's joint states do not match the bundle's robot "
                f"'{self._robot}': missing {brief(missing)}, unknown {brief(unknown)} (robot publishes "
                f"{brief(list(names))}; "
                "list joints the policy does not use in extra_joints)"
            )

    def store(self, names: list[str], position, velocity, effort, received: float) -> str | None:
        """Keep a message as the newest sample; returns why it was refused, or None."""
        read = self._read(names, position, velocity, effort)
        if isinstance(read, str):
            return read
        position, velocity = read
        assert self._layout is not None, "a message that was read has set the layout"
        _, used, rows = self._layout
        q = np.full(len(self.joints), np.nan)
        qd = np.full(len(self.joints), np.nan)
        q[rows] = position[used]
        qd[rows] = velocity[used]
        if self.latest is not None:
            gap = received - self.latest.received
            self.period = gap if math.isinf(self.period) else 0.9 * self.period + 0.1 * gap
        self.latest = JointSample(q, qd, received)
        return None

    @property
    def fresh(self) -> bool:
        """A sample has arrived that no tick has taken yet."""
        return self.latest is not None and self.latest is not self.used

    def take(self) -> tuple[JointSample | None, bool]:
        """The newest sample for this tick, and whether it is one no tick took before."""
        sample, fresh = self.latest, self.fresh
        self.used = sample
        return sample, fresh

    def _read(self, names: list[str], position, velocity, effort) -> str | tuple[np.ndarray, np.ndarray]:
        """Why the message is refused, or its positions and velocities as arrays (in message order; the
        joint layout in `_layout`). A robot sends the same names every time: they are checked once,
        then only the lengths and the values are checked per message."""
        n = len(names)
        if len(position) != n or len(velocity) != n or len(effort) not in (0, n):
            return (
                f"lengths: {n} names, {len(position)} positions, {len(velocity)} velocities, "
                f"{len(effort)} efforts (positions and velocities must match the names; efforts too or empty)"
            )
        if self._layout is None or names != self._layout[0]:
            if len(set(names)) != n:
                return f"duplicate: joint names repeat in {brief(names)}"
            unknown = [name for name in names if name not in self._allowed]
            if unknown:
                return f"unknown: joints {brief(unknown)} are not the bundle's ({brief(list(self.joints))})"
            missing = [name for name in self.joints if name not in names]
            if missing:
                return f"missing: joints {brief(missing)} absent"
            used = [i for i, name in enumerate(names) if name in self._index]
            rows = [self._index[names[i]] for i in used]
            self._layout = (names, np.array(used, dtype=np.intp), np.array(rows, dtype=np.intp))
        try:
            position, velocity = np.asarray(position, dtype=float), np.asarray(velocity, dtype=float)
        except (TypeError, ValueError):
            return "nonfinite: a position or velocity is not a number"
        used = self._layout[1]
        if not (np.isfinite(position[used]).all() and np.isfinite(velocity[used]).all()):
            return "nonfinite: a position or velocity is NaN or infinite (efforts may be NaN)"
        return position, velocity
