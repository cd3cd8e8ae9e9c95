"""Stop training when anything goes non-finite, saying what, when, and where to restart from.

Checks are recorded on the training device and read back once per logging window (one host sync
for everything), never per update: a GPU keeps running ahead of the Python loop, and a NaN still
stops the run within one window, named.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from q2real.configs.errors import Q2RealError


class NonFiniteError(Q2RealError, RuntimeError):
    """A loss, parameter or env output became NaN or infinite."""


def check_finite(values: dict[str, torch.Tensor], step: int, last_checkpoint: Path | None) -> None:
    """One device sync for all `values`; raises naming the first non-finite one."""
    flags = FiniteFlags()
    flags.record(values, step)
    flags.check(last_checkpoint)


class FiniteFlags:
    """For each named tensor, when it was first non-finite since the last check, kept on the device:
    recording never syncs, and `check` reads everything back at once and names the earliest, so a NaN
    loss that then poisons the actions is reported as the loss, not as the env output it caused."""

    NEVER = torch.iinfo(torch.int64).max

    def __init__(self) -> None:
        self._first: dict[str, torch.Tensor] = {}
        """Name -> index into `_steps` of the first record in which it was non-finite (NEVER if none)."""
        self._steps: list[int] = []
        """The env step of each `record` call since the last check, in call order."""

    def record(self, values: dict[str, torch.Tensor], step: int) -> None:
        event = len(self._steps)
        self._steps.append(step)
        for name, value in values.items():
            bad = ~torch.isfinite(value).all()
            first = self._first.get(name)
            if first is None:
                first = torch.full((), self.NEVER, dtype=torch.int64, device=value.device)
            self._first[name] = torch.where(bad & (first == self.NEVER), event, first)

    def check(self, last_checkpoint: Path | None) -> None:
        """Raise NonFiniteError for the earliest non-finite tensor since the last check; start a new window."""
        first, steps = self._first, self._steps
        self._first, self._steps = {}, []
        if not first:
            return
        events = torch.stack(list(first.values())).tolist()
        event, _, name = min(zip(events, range(len(events)), first, strict=True))  # same record: first named
        if event == self.NEVER:
            return
        where = f"last good checkpoint: {last_checkpoint}" if last_checkpoint else "no checkpoint was written yet"
        raise NonFiniteError(f"{name} became non-finite at env step {steps[event]}; training stopped ({where})")


def parameters_of(module: nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    return {f"{prefix}.{name}": p for name, p in module.named_parameters()}
