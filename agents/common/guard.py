"""Stop training the moment anything goes non-finite, saying what and where to restart from."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from q2real.configs.errors import Q2RealError


class NonFiniteError(Q2RealError, RuntimeError):
    """A loss, parameter or env output became NaN or infinite."""


def check_finite(values: dict[str, torch.Tensor], step: int, last_checkpoint: Path | None) -> None:
    """One device sync for all `values`; raises naming the first non-finite one."""
    if not values:
        return
    flags = torch.stack([torch.isfinite(v).all() for v in values.values()])
    if bool(flags.all()):
        return
    name = next(n for n, ok in zip(values, flags.tolist(), strict=True) if not ok)
    where = f"last good checkpoint: {last_checkpoint}" if last_checkpoint else "no checkpoint was written yet"
    raise NonFiniteError(f"{name} became non-finite at env step {step}; training stopped ({where})")


def parameters_of(module: nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    return {f"{prefix}.{name}": p for name, p in module.named_parameters()}
