"""The safety shield between a policy and a physical robot (plain numpy; no ROS, torch or JAX)."""

from q2real.safety.flags import Mode, Rule
from q2real.safety.shield import Command, Shield, ShieldConfig

__all__ = ["Command", "Mode", "Rule", "Shield", "ShieldConfig"]
