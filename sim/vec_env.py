"""The batched env API every q2real learner talks to, whatever simulates underneath.

Stateful and batched (like gymnasium's vector envs and Isaac Lab) rather than functional (like
Playground), because the native MuJoCo backend owns C-side state; everything crossing the API is a
torch tensor on the training device. Actions are always in [-1, 1]; each env maps them to its own
actuator range, so agents never need to know a robot's limits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from q2real.configs.loader import ConfigError

if TYPE_CHECKING:
    from q2real.sim.action_steps import ActionSteps


@dataclass
class StepResult:
    """One batched transition.

    `next_obs` is the true successor of the observation the action was taken in, also for envs whose
    episode just ended, while `obs` is what to act on next (the first observation of the new episode
    there). Off-policy learners store `next_obs`; bootstrapping from `obs` after an auto-reset would
    bootstrap from the wrong episode.
    """

    obs: torch.Tensor
    next_obs: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    """True where the episode reached a terminal state: do not bootstrap."""
    truncated: torch.Tensor
    """True where the episode was cut by a time limit: bootstrap from `next_obs`."""
    cost: torch.Tensor
    """Per-step safety cost for constrained RL; zeros for tasks that define none."""
    info: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def done(self) -> torch.Tensor:
        return self.terminated | self.truncated


class VecEnv(ABC):
    """N environments stepped together; auto-reset on episode end."""

    num_envs: int
    obs_dim: int
    action_dim: int
    device: torch.device
    obs_names: tuple[str, ...]
    """Names of the observation terms, in order (one entry per term, see `obs_dims`)."""
    obs_dims: tuple[int, ...]
    obs_sources: tuple[dict, ...] | None = None
    """Per term, where it comes from on a robot (`q2real.deploy_ros.observation`); None if unknown."""
    figures: dict | None = None
    """What the deploy node needs to show the operator the task's figures (`Task.figures`)."""
    action_scale: torch.Tensor
    action_offset: torch.Tensor
    """The command an action in [-1, 1] stands for is `action_offset + action_scale * action`, in the
    robot's units (N m, N or rad per joint for q2real tasks); policy bundles bake this in."""
    action_steps: ActionSteps | None = None
    """How an action moves the target from the previous action (the task's `action_rate`); None: an
    action is the target itself."""
    control_period: float | None
    """Seconds between actions, where the env knows it."""
    has_cost: bool = False
    """Whether `StepResult.cost` carries a safety signal (a task that defines one); otherwise it is
    always zero and a constrained learner would train against nothing."""
    reward_terms: tuple[str, ...] = ()
    """Names of the reward's terms (`q2real.sim.reward`): the columns of `StepResult.info["reward_terms"]`,
    each term's scaled part of the step's reward; empty where the env does not split its reward."""
    shield_in_loop: bool = False
    """The shield's clamps act inside the env (`env.shield_in_loop`): what the policy asks for and what
    the robot is sent differ, and the replay holds the former."""

    critic_names: tuple[str, ...] = ()
    """Critic-only terms after the policy's observation (`TaskConfig.critic_terms`, `critic_dynamics`)."""
    critic_dims: tuple[int, ...] = ()
    """Their widths."""

    @property
    def policy_obs_dim(self) -> int:
        """Leading observation columns the policy sees (what a bundle takes); any after them are
        critic-only terms (`TaskConfig.critic_terms`)."""
        return self.obs_dim

    def term_columns(self, name: str) -> slice | None:
        """The observation columns of the term `name`; None where the observation has no such term."""
        if name not in self.obs_names:
            return None
        i = self.obs_names.index(name)
        start = sum(self.obs_dims[:i])
        return slice(start, start + self.obs_dims[i])

    def require_policy_obs(self, what: str) -> None:
        """Refuse critic-only observation terms for `what`, which sees only what the robot observes."""
        if self.policy_obs_dim != self.obs_dim:
            raise ConfigError(
                f"env.task_params.critic_terms: {what} uses only what the robot observes; "
                "set critic_terms and critic_dynamics to false for it"
            )

    @abstractmethod
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every env; returns observations (num_envs, obs_dim). A seed makes the run repeatable."""

    @abstractmethod
    def step(self, action: torch.Tensor) -> StepResult:
        """Apply actions in [-1, 1] of shape (num_envs, action_dim) for one control period."""

    @abstractmethod
    def close(self) -> None:
        """Release worker threads, processes or device memory."""

    def state_dict(self) -> dict[str, Any] | None:
        """Everything needed to continue the current episodes exactly, or None where the env cannot
        export it (a resumed run then starts fresh episodes)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot restore episodes")

    def check_action(self, action: torch.Tensor) -> torch.Tensor:
        """Reject actions of the wrong shape; clip to [-1, 1] and move to this env's device."""
        if not isinstance(action, torch.Tensor):
            raise TypeError(f"action: expected a torch.Tensor, got {type(action).__name__}")
        if action.shape != (self.num_envs, self.action_dim):
            raise ValueError(f"action: expected shape ({self.num_envs}, {self.action_dim}), got {tuple(action.shape)}")
        return action.to(self.device, torch.float32).clamp(-1.0, 1.0)
