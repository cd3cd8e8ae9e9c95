"""Per-env episode bookkeeping on the device: returns, costs, lengths and reward terms of finished episodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from q2real.sim.shield_clamps import RULES
from q2real.sim.vec_env import StepResult


class EpisodeTracker:
    """Accumulates running and finished-episode sums as fixed-shape tensors, so tracking never forces a
    device sync; the means are read out only when logging."""

    def __init__(self, num_envs: int, device: torch.device, reward_terms: Sequence[str] = ()):
        self._running = torch.zeros(3, num_envs, device=device)  # return, cost, length
        self._finished = torch.zeros(3, device=device)
        self._count = torch.zeros((), device=device)
        self._training_cost = torch.zeros((), device=device)
        """Every step's cost summed over all envs since the run began: what learning has cost."""
        # Tasks that report `info["success"]`: an episode succeeded if the flag was ever set in it.
        self._success_running = torch.zeros(num_envs, device=device)
        self._success_finished = torch.zeros((), device=device)
        self._reports_success = False
        # With the shield's clamps in the loop (`info["shield_rules"]`): per rule, the fraction of an
        # episode's actions it changed, summed over finished episodes.
        self._rules_running = torch.zeros(len(RULES), num_envs, device=device)
        self._rules_finished = torch.zeros(len(RULES), device=device)
        self._reports_rules = False
        self.reward_terms = tuple(reward_terms)
        """The env's reward terms (`VecEnv.reward_terms`): per term, the scaled episode sum is summed over
        finished episodes from `info["reward_terms"]` and logged as `reward/<term>`."""
        self._terms_running = torch.zeros(len(self.reward_terms), num_envs, device=device)
        self._terms_finished = torch.zeros(len(self.reward_terms), device=device)
        self._reports_terms = False
        """Set once a step carried the terms: a learner fed from the robot's stream has none to log."""

    def update(self, result: StepResult) -> None:
        self._running += torch.stack([result.reward, result.cost, torch.ones_like(result.reward)])
        self._training_cost += result.cost.sum()
        done = result.done.float()
        self._finished += (self._running * done).sum(dim=1)
        self._count += done.sum()
        if "success" in result.info:
            self._reports_success = True
            self._success_running = torch.maximum(self._success_running, result.info["success"].float())
            self._success_finished += (self._success_running * done).sum()
            self._success_running *= 1.0 - done
        if "shield_rules" in result.info:
            self._reports_rules = True
            self._rules_running += result.info["shield_rules"].T.float()
            self._rules_finished += (self._rules_running / self._running[2] * done).sum(dim=1)
            self._rules_running *= 1.0 - done
        if self.reward_terms and "reward_terms" in result.info:
            self._reports_terms = True
            self._terms_running += result.info["reward_terms"].T
            self._terms_finished += (self._terms_running * done).sum(dim=1)
            self._terms_running *= 1.0 - done
        self._running *= 1.0 - done

    def pop(self) -> dict[str, float]:
        """Means over episodes finished since the last call; empty when none finished."""
        count = int(self._count.item())
        if count == 0:
            return {}
        ret, cost, length = (self._finished / count).tolist()
        means = {"episode_return": ret, "episode_cost": cost, "episode_length": length, "episodes": count}
        means["training_cost"] = float(self._training_cost)
        if self._reports_success:
            means["episode_success"] = float(self._success_finished) / count
        if self._reports_rules:
            fractions = (self._rules_finished / count).tolist()
            means |= {f"shield_{rule.lower()}": value for rule, value in zip(RULES, fractions, strict=True)}
            self._rules_finished.zero_()
        if self._reports_terms:
            sums = (self._terms_finished / count).tolist()
            means |= {f"reward/{term}": value for term, value in zip(self.reward_terms, sums, strict=True)}
            self._terms_finished.zero_()
        self._finished.zero_()
        self._count.zero_()
        self._success_finished.zero_()
        return means

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "running": self._running,
            "finished": self._finished,
            "count": self._count,
            "training_cost": self._training_cost,
            "success_running": self._success_running,
            "success_finished": self._success_finished,
            "reports_success": torch.tensor(self._reports_success),
            "rules_running": self._rules_running,
            "rules_finished": self._rules_finished,
            "reports_rules": torch.tensor(self._reports_rules),
        }
        if self.reward_terms:
            state["reward_terms"] = self._terms_state()
        return state

    def _terms_state(self) -> dict[str, list]:
        """The reward terms' sums as plain lists (read back at checkpoint time only): a checkpoint's tensors
        must match a resuming run's, and one written before the terms were logged has none, so the terms
        travel beside them and a resumed run without them starts its sums at zero."""
        return {
            "names": list(self.reward_terms),
            "running": self._terms_running.tolist(),
            "finished": self._terms_finished.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._running.copy_(state["running"])
        self._finished.copy_(state["finished"])
        self._count.copy_(state["count"])
        self._training_cost.copy_(state["training_cost"])
        self._success_running.copy_(state["success_running"])
        self._success_finished.copy_(state["success_finished"])
        self._reports_success = bool(state["reports_success"])
        if "rules_running" in state:  # checkpoints from before the shield's clamps were logged lack them
            self._rules_running.copy_(state["rules_running"])
            self._rules_finished.copy_(state["rules_finished"])
            self._reports_rules = bool(state["reports_rules"])
        terms = state.get("reward_terms")
        if terms is not None and tuple(terms["names"]) == self.reward_terms:
            self._terms_running.copy_(torch.tensor(terms["running"]))
            self._terms_finished.copy_(torch.tensor(terms["finished"]))
