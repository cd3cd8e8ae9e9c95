"""Shared fixtures. MJX tests compile XLA programs, so envs are built once per module and kept small."""

from __future__ import annotations

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
