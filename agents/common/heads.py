"""Critic value heads: how critic outputs become Q-values and how TD targets become a loss.

`ScalarHead` is the usual regression critic; `CategoricalHead` is the C51 distributional critic
(Bellemare et al. 2017) used by FastTD3 and FlashSAC; `QuantileHead` is the quantile-regression critic
(QR-DQN, Dabney et al. 2018) with the ensemble's targets pooled (TQC, Kuznetsov et al. 2020) that COX-Q
uses. All take the same inputs, so a learner picks one by config without knowing which.
"""

from __future__ import annotations

import torch
from torch import nn


class ScalarHead(nn.Module):
    out_features = 1

    def __init__(self, huber: bool = False, upper: bool = False):
        """`upper`: bootstrap from the largest target member, the conservative side of a cost critic."""
        super().__init__()
        self.huber, self.upper = huber, upper

    def q(self, out: torch.Tensor) -> torch.Tensor:
        """(E, B, 1) -> (E, B)."""
        return out.squeeze(-1)

    def loss(
        self,
        out: torch.Tensor,
        target_out: torch.Tensor,
        reward: torch.Tensor,
        discount: torch.Tensor,
        bonus: torch.Tensor,
        weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Clipped double-Q TD loss (Fujimoto et al. 2018, eq. 10): y = r + discount * (min_i Q'_i + bonus),
        where `bonus` is -alpha log pi(a'|s') for SAC (Haarnoja et al. 2018, eq. 3) and 0 for TD3;
        `discount` is gamma^n, or 0 after a terminal state. Samples are weighted by `weight` (importance
        weights of prioritized replay). Returns the loss and each sample's largest |TD error| over members."""
        with torch.no_grad():
            members = self.q(target_out)
            y = reward + discount * ((members.amax(dim=0) if self.upper else members.amin(dim=0)) + bonus)
        error = self.q(out) - y
        per_member = (
            nn.functional.huber_loss(error, torch.zeros_like(error), reduction="none") if self.huber else error.pow(2)
        )
        return _weighted(per_member, weight), error.detach().abs().amax(dim=0)


class CategoricalHead(nn.Module):
    """Fixed support of `num_atoms` values in [v_min, v_max]; Q = E[z]."""

    atoms: torch.Tensor

    def __init__(self, num_atoms: int, v_min: float, v_max: float):
        super().__init__()
        self.out_features = num_atoms
        self.register_buffer("atoms", torch.linspace(v_min, v_max, num_atoms))
        self.v_min, self.v_max = v_min, v_max

    def q(self, out: torch.Tensor) -> torch.Tensor:
        return (out.softmax(dim=-1) * self.atoms).sum(-1)

    def project(self, probs: torch.Tensor, shifted: torch.Tensor) -> torch.Tensor:
        """Project probabilities on shifted atoms (B, K) back onto the fixed support (C51 Alg. 1)."""
        k = self.atoms.numel()
        delta = (self.v_max - self.v_min) / (k - 1)
        b = (shifted.clamp(self.v_min, self.v_max) - self.v_min) / delta
        lower, upper = b.floor().long(), b.ceil().long()
        # When b is an integer both neighbours coincide; give all mass to it.
        lower_weight = torch.where(upper == lower, torch.ones_like(b), upper.float() - b)
        upper_weight = b - lower.float()
        target = torch.zeros_like(probs)
        target.scatter_add_(-1, lower, probs * lower_weight)
        target.scatter_add_(-1, upper, probs * upper_weight)
        return target

    def loss(
        self,
        out: torch.Tensor,
        target_out: torch.Tensor,
        reward: torch.Tensor,
        discount: torch.Tensor,
        bonus: torch.Tensor,
        weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-entropy to the projected target distribution of the target member with the lowest mean
        (FastTD3's distributional clipped double-Q); the support shifts as z' = r + discount (z + bonus).
        Weighted like `ScalarHead.loss`; the TD error is that of the distributions' means."""
        with torch.no_grad():
            pick = self.q(target_out).argmin(dim=0)  # (B,)
            logits = target_out.gather(0, pick.view(1, -1, 1).expand(1, -1, target_out.shape[-1])).squeeze(0)
            shifted = reward[:, None] + discount[:, None] * (self.atoms[None] + bonus[:, None])
            target = self.project(logits.softmax(-1), shifted)
            td = (self.q(out) - (target * self.atoms).sum(-1)).abs().amax(dim=0)
        return _weighted(-(target * out.log_softmax(-1)).sum(-1), weight), td


class QuantileHead(nn.Module):
    """`num_quantiles` outputs per member estimate the return's quantiles at the midpoints
    tau_j = (j + 1/2) / N; Q is their mean."""

    taus: torch.Tensor

    def __init__(self, num_quantiles: int, drop_top: int = 0, kappa: float = 1.0):
        """`drop_top`: target atoms removed from the top of the pooled target per member (TQC's
        truncation of the overestimated right tail; COX-Q's code keeps all, 0)."""
        super().__init__()
        self.out_features, self.drop_top, self.kappa = num_quantiles, drop_top, kappa
        self.register_buffer("taus", (torch.arange(num_quantiles) + 0.5) / num_quantiles)

    def q(self, out: torch.Tensor) -> torch.Tensor:
        return out.mean(-1)

    def upper_tail(self, out: torch.Tensor, start: int) -> torch.Tensor:
        """The mean of each member's quantiles from index `start` up, (E, B): a cost critic's estimate
        with its optimistic (low-cost) quantiles left out."""
        return out[..., start:].mean(-1)

    def target_atoms(self, target_out: torch.Tensor) -> torch.Tensor:
        """Every target member's quantiles pooled and sorted, (B, E N - E drop_top), the top removed."""
        pooled = target_out.permute(1, 0, 2).flatten(1).sort(dim=-1).values
        return pooled[:, : pooled.shape[-1] - self.drop_top * target_out.shape[0]]

    def loss(
        self,
        out: torch.Tensor,
        target_out: torch.Tensor,
        reward: torch.Tensor,
        discount: torch.Tensor,
        bonus: torch.Tensor,
        weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantile-Huber loss of every member against the shared pooled target z' = r + discount (z + bonus):
        rho(u) = |tau - 1[u < 0]| H_kappa(u) / kappa with u = z' - theta, averaged over the target atoms and
        summed over the member's quantiles (QR-DQN eq. 10). Weighted like `ScalarHead.loss`."""
        with torch.no_grad():
            target = reward[:, None] + discount[:, None] * (self.target_atoms(target_out) + bonus[:, None])
        u = target[None, :, None, :] - out[..., None]  # (E, B, N, M)
        huber = nn.functional.huber_loss(u, torch.zeros_like(u), reduction="none", delta=self.kappa) / self.kappa
        rho = (self.taus[:, None] - (u.detach() < 0).float()).abs() * huber
        td = (self.q(out).detach() - target.mean(-1)).abs().amax(dim=0)
        return _weighted(rho.mean(-1).sum(-1), weight), td


def _weighted(per_member: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """(E, B) per-sample losses -> sum over members of the (weighted) mean over samples."""
    if weight is not None:
        per_member = per_member * weight
    return per_member.mean(dim=1).sum()
