"""The shield's deterministic per-tick clamps as batched torch, so a policy trains under the rules the
robot will enforce on it (`env.shield_in_loop`).

The same rules as `q2real.safety.shield.ReferenceShield` in RUN, in the same order, for every env at once:
  clip + map    a in [-action_clip, action_clip]; target = offset + scale a (effort for torque robots)
  soft limits   the target inside the hard limits shrunk by `soft_limit_margin`
  rate          |target - previous target| <= velocity_limit * dt, and inside the hard limits
  effort        the target moved toward the measured pose until |kp (target - q) - kd qd| <= effort_limit,
                within the rate window
  torque robots effort within +-effort_limit, and zero where it pushes a joint further past a limit
What the shield does on top (state validity, deadlines, the learned veto, the gain reduction of the
effort rule's last resort, modes) needs a robot's clock and faults, not a policy's action: it is not
here. `tests/sim/test_shield_clamps.py` runs this and the numpy shield side by side on random specs,
states and actions and requires the same commands.
"""

from __future__ import annotations

import torch

from q2real.hardware import RobotSpec
from q2real.safety.shield import ShieldConfig

RULES = ("ACTION_CLIPPED", "POSITION_LIMIT", "RATE_LIMIT", "EFFORT_LIMIT")
"""The rules whose per-env activity `ShieldClamps.__call__` reports, in column order (`Rule` names)."""


class ShieldClamps:
    """Per-env shield state (the previous target) and the batched clamps, on the training device."""

    def __init__(
        self,
        spec: RobotSpec,
        config: ShieldConfig,
        scale: torch.Tensor,
        offset: torch.Tensor,
        num_envs: int,
        device: torch.device,
    ):
        config.validate()

        def joint(field: str) -> torch.Tensor:
            return torch.tensor(spec.array(field), dtype=torch.float32, device=device)

        limits = torch.tensor(spec.array("position_limits"), dtype=torch.float32, device=device)
        self.hard_lo, self.hard_hi = limits[:, 0], limits[:, 1]
        span = self.hard_hi - self.hard_lo
        span = torch.where(torch.isfinite(span), span, torch.zeros_like(span))
        self.soft_lo = self.hard_lo + config.soft_limit_margin * span
        self.soft_hi = self.hard_hi - config.soft_limit_margin * span
        self.torque = spec.control_mode == "torque"
        self.max_effort = joint("effort_limit")
        self.step = torch.tensor(spec.rate_window, dtype=torch.float32, device=device)
        kp, self.kd = joint("kp"), joint("kd")
        self.inv_kp = torch.where(kp > 0, 1.0 / torch.where(kp > 0, kp, torch.ones_like(kp)), torch.zeros_like(kp))
        self.effort_reach = self.max_effort * self.inv_kp
        self.clip = config.action_clip
        self.scale, self.offset = scale.to(device), offset.to(device)
        # On the robot the policy takes over at the end of the ramp, whose last target is the default pose.
        self.start = torch.minimum(torch.maximum(joint("default_position"), self.hard_lo), self.hard_hi)
        self.previous = self.start.repeat(num_envs, 1)

    def reset(self, mask: torch.Tensor) -> None:
        """Envs where `mask` is true start over from the handover's target (the default pose)."""
        self.previous = torch.where(mask[:, None], self.start, self.previous)

    def __call__(
        self, action: torch.Tensor, q: torch.Tensor, qd: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(command in the robot's units (num_envs, joints), which rules acted (num_envs, len(RULES)) bool,
        which joints' commands they changed (num_envs, joints) bool) for policy actions and the measured
        joint states; advances the previous target."""
        clipped = action.clamp(-self.clip, self.clip)
        acted = [(clipped != action).any(-1)]
        wanted = self.offset + self.scale * action
        command = self.offset + self.scale * clipped
        if self.torque:
            limited = torch.minimum(torch.maximum(command, -self.max_effort), self.max_effort)
            pushing_out = ((q >= self.hard_hi) & (limited > 0)) | ((q <= self.hard_lo) & (limited < 0))
            limited = torch.where(pushing_out, torch.zeros_like(limited), limited)
            none = torch.zeros_like(acted[0])
            acted += [none, none, (limited != command).any(-1)]
            return limited, torch.stack(acted, dim=-1), limited != wanted
        soft = torch.minimum(torch.maximum(command, self.soft_lo), self.soft_hi)
        lo = torch.maximum(self.previous - self.step, self.hard_lo)
        hi = torch.minimum(self.previous + self.step, self.hard_hi)
        rated = torch.minimum(torch.maximum(soft, lo), hi)
        center = q + self.kd * qd * self.inv_kp
        reachable = torch.minimum(torch.maximum(rated, center - self.effort_reach), center + self.effort_reach)
        feasible = torch.minimum(torch.maximum(reachable, lo), hi)
        acted += [(soft != command).any(-1), (rated != soft).any(-1), (feasible != rated).any(-1)]
        self.previous = feasible
        return feasible, torch.stack(acted, dim=-1), feasible != wanted
