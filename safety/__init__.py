"""The safety shield between a policy and a physical robot (numpy and numba; no ROS, torch or JAX)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from q2real.safety.flags import Mode, Rule
from q2real.safety.shield import Command, ReferenceShield, ShieldConfig

if TYPE_CHECKING:
    from q2real.safety.compiled import Shield

__all__ = ["Command", "Mode", "ReferenceShield", "Rule", "Shield", "ShieldConfig"]


def __getattr__(name: str):  # noqa: ANN202
    """`Shield` compiles its kernels on import: configs and training, which read `ShieldConfig`, do not."""
    if name == "Shield":
        from q2real.safety.compiled import Shield

        return Shield
    raise AttributeError(f"module 'q2real.safety' has no attribute {name!r}")
