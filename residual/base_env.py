"""The env a residual learner sees: every observation extended with the frozen base policy's action.

`[obs, a_base(obs)]` is what ResFiT's residual actor takes as input (`observation.base_action`), and
storing it means replay holds the base action for both s and s' of every transition: the critic's
targets and the actor's updates never run the base again. For a chunk base, `a_base` is the whole
chunk the base predicts at that observation; the residual then corrects that chunk (Policy
Decorator's residual over the executed chunk), and the pair runs through the robot's chunk queue.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from q2real.sim import VecEnv
from q2real.sim.vec_env import StepResult


class BaseActionEnv(VecEnv):
    def __init__(self, env: VecEnv, base: nn.Module, base_dim: int):
        env.require_policy_obs("a residual over a base policy")
        self.env = env
        self.base = base.to(env.device).eval().requires_grad_(False)
        self.base_dim = base_dim
        self.num_envs, self.action_dim, self.device = env.num_envs, env.action_dim, env.device
        self.obs_dim = env.obs_dim + base_dim
        self.obs_names = (*env.obs_names, "base_action")
        self.obs_dims = (*env.obs_dims, base_dim)
        self.obs_sources = None  # the extension is computed, never observed: bundles take the raw env's
        self.action_scale, self.action_offset = env.action_scale, env.action_offset
        self.control_period = env.control_period
        self.spec = getattr(env, "spec", None)
        self.episode_length = getattr(env, "episode_length", None)

    @torch.no_grad()
    def extend(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.cat([obs, self.base(obs).clamp(-1.0, 1.0)], dim=-1)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        return self.extend(self.env.reset(seed=seed))

    def step(self, action: torch.Tensor) -> StepResult:
        result = self.env.step(action)
        result.obs = self.extend(result.obs)
        result.next_obs = self.extend(result.next_obs)
        return result

    def close(self) -> None:
        self.env.close()

    def state_dict(self) -> dict[str, Any] | None:
        return self.env.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env.load_state_dict(state)
