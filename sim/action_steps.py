"""Actions as steps (`TaskConfig.action_rate`): how a policy's action moves a position target.

The target's action moves from the previous one by `size * action` per tick, `size` being a fraction
of the shield's rate window (velocity limit x control period) in action units, and stays inside the
shield's soft position window: the shield cuts every target past it, and a step policy's target left
there would stick to the edge, cut on every tick. The same arithmetic runs in the env and in the
exported bundle's graph (torch ops that trace to ONNX), so what the node receives is a target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from q2real.configs.loader import ConfigError
from q2real.hardware import RobotSpec
from q2real.hardware.action import action_from_command

KEY = "env.task_params.action_rate"


@dataclass(frozen=True)
class ActionSteps:
    size: torch.Tensor
    """Per joint, how far an action of 1 moves the target in one tick, in action units."""
    low: torch.Tensor
    high: torch.Tensor
    """Per joint, the soft position window in action units (within [-1, 1])."""

    @classmethod
    def of(
        cls, spec: RobotSpec, rate: float, soft_limit_margin: float, scale: np.ndarray, offset: np.ndarray, device
    ) -> ActionSteps:
        if spec.control_mode != "position":
            raise ConfigError(f"{KEY}: steps a position target; {spec.name} is {spec.control_mode}-controlled")
        if not 0 < rate <= 1:
            raise ConfigError(f"{KEY}: expected a fraction of the shield's rate window in (0, 1], got {rate}")
        size = np.minimum(np.divide(rate * spec.rate_window, scale, out=np.zeros_like(scale), where=scale > 0), 2.0)
        limits = spec.array("position_limits")
        margin = np.nan_to_num(soft_limit_margin * (limits[:, 1] - limits[:, 0]), nan=0.0, posinf=0.0)
        soft = np.stack([limits[:, 0] + margin, limits[:, 1] - margin], axis=-1)
        low, high = (np.clip(action_from_command(side, scale, offset), -1.0, 1.0) for side in soft.T)
        as_tensor = lambda a: torch.tensor(a, dtype=torch.float32, device=device)  # noqa: E731
        return cls(as_tensor(size), as_tensor(low), as_tensor(high))

    def target(self, last: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The action that sets this tick's target, from the previous one and the policy's step `action`."""
        return torch.minimum(torch.maximum(last + self.size * action, self.low), self.high)

    def to(self, device) -> ActionSteps:
        return ActionSteps(self.size.to(device), self.low.to(device), self.high.to(device))

    def metadata(self) -> dict[str, list]:
        """The bundle's record of the steps its graph takes (`action.step`, `action.step_range`)."""
        return {
            "step": self.size.double().tolist(),
            "step_range": [self.low.double().tolist(), self.high.double().tolist()],
        }
