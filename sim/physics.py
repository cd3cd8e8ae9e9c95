"""Batched physics state as seen by tasks, identical for both backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mujoco
import numpy as np
import torch


@dataclass
class PhysicsState:
    """Torch views of the fields task logic may read, each (num_envs, ...) float32.

    Tasks read only these fields, so a task runs unchanged on native MuJoCo and on MJX. Positions of
    sites or bodies reach a task through MJCF sensors (`framepos`, ...), which both backends fill.
    """

    qpos: torch.Tensor
    qvel: torch.Tensor
    sensordata: torch.Tensor


class PhysicsBackend(Protocol):
    """Steps N copies of one MuJoCo model; implemented natively (CPU threads) and on MJX (JAX)."""

    model: mujoco.MjModel
    num_envs: int
    device: torch.device

    def step(self, ctrl: torch.Tensor, xfrc: torch.Tensor | None = None) -> PhysicsState:
        """Hold `ctrl` (num_envs, nu) and the body wrenches `xfrc` (num_envs, nbody, 6; None: no external
        forces) for one control period (the spec's substeps) and return the state."""
        ...

    def set_state(self, mask: torch.Tensor, qpos: torch.Tensor, qvel: torch.Tensor) -> PhysicsState:
        """Overwrite qpos/qvel of the envs where `mask` is true (time and warm-start cleared)."""
        ...

    def set_model_fields(self, model_fields: dict[str, np.ndarray]) -> None:
        """Install new per-env values (num_envs, *field.shape) of the model fields given at construction."""
        ...

    def full_state(self) -> dict[str, torch.Tensor]:
        """Everything needed to continue the simulation exactly, as CPU tensors (for checkpoints)."""
        ...

    def load_full_state(self, state: dict[str, torch.Tensor]) -> PhysicsState: ...

    def close(self) -> None: ...
