"""The deterministic per-joint rules, as small pure functions on numpy arrays (one entry per joint)."""

from __future__ import annotations

import numpy as np


def clip(x: np.ndarray, lo, hi) -> np.ndarray:
    """np.clip without its dispatch layers (a few microseconds per call, many calls per tick)."""
    return np.minimum(np.maximum(x, lo), hi)


def gain_scale(
    target: np.ndarray, q: np.ndarray, qd: np.ndarray, kp: np.ndarray, kd: np.ndarray, max_effort: np.ndarray
) -> np.ndarray:
    """Per-joint factor in (0, 1] on (kp, kd) that brings the PD torque within +-max_effort when moving
    the target alone could not (e.g. kd |qd| already exceeds the limit). A torque that overflows
    (a continuous joint read at 1e308) is not a number to compare against: its gains go to zero."""
    with np.errstate(over="ignore", invalid="ignore"):
        torque = np.abs(kp * (target - q) - kd * qd)
        scale = np.where(torque <= max_effort, 1.0, max_effort / np.maximum(torque, max_effort))
    return np.nan_to_num(scale, nan=0.0)


def outward_effort_zeroed(effort: np.ndarray, q: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """ros2_control's effort rule: at or beyond a position limit, effort pushing further out is zeroed."""
    pushing_out = ((q >= upper) & (effort > 0)) | ((q <= lower) & (effort < 0))
    return np.where(pushing_out, 0.0, effort)
