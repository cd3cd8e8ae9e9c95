"""Per-env episode bookkeeping on the device: returns, costs and lengths of finished episodes."""

from __future__ import annotations

import torch

from q2real.sim.shield_clamps import RULES
from q2real.sim.vec_env import StepResult


class EpisodeTracker:
    """Accumulates running and finished-episode sums as fixed-shape tensors, so tracking never forces a
    device sync; the means are read out only when logging."""

    def __init__(self, num_envs: int, device: torch.device):
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
        self._finished.zero_()
        self._count.zero_()
        self._success_finished.zero_()
        return means

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
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

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
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
