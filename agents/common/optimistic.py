"""COX-Q's optimistic exploration step, batched over states (Li, Spaan & Kooij 2026, Sec. 4).

The exploring policy shifts the Gaussian's pre-tanh mean mu along a direction v in the metric of its
covariance Sigma = diag(sigma^2): <u, v>_Sigma = sum_i u_i sigma_i^2 v_i. v follows the reward critics'
upper confidence bound and away from the cost critics' lower one. Where the cost has no slack left, v is
projected onto the cone {<v, g_r>_Sigma >= 0, <v, g_c>_Sigma >= 0}, so the step improves neither term at
the other's expense. The step length keeps KL(N(mu, Sigma) || N(mu + step, Sigma)) <= delta^2 / 2, and
shrinks so the first-order cost increase stays within the slack.
"""

from __future__ import annotations

import torch

FREE, FEASIBLE, ONTO_REWARD, ONTO_COST, ONTO_BOTH = range(5)
CASES = ("free", "feasible", "onto_reward", "onto_cost", "onto_both")
"""How each state's direction was chosen: slack left (no projection), in the cone already, projected onto
the reward plane, onto the cost plane, onto their intersection."""


def sigma_dot(u: torch.Tensor, v: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    return (u * var * v).sum(-1)


def project_to_cone(
    v: torch.Tensor, g_r: torch.Tensor, g_c: torch.Tensor, var: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Sigma-nearest point of the cone to each row of `v`, and which case gave it (`CASES[1:]`).

    The projection onto the intersection of two half-spaces through the origin is `v` itself, its
    projection onto one boundary plane if that lies inside the other half-space, or else its projection
    onto both planes' intersection; among feasible candidates the nearest wins. `eps` is relative: it
    only keeps the 2 x 2 solve away from zero for (nearly) parallel gradients, at any gradient scale
    (COX-Q's code adds an absolute 1e-5, which swamps the Gram matrix of small gradients)."""
    vr, vc = sigma_dot(v, g_r, var), sigma_dot(v, g_c, var)
    tiny = torch.finfo(v.dtype).tiny
    srr, scc = sigma_dot(g_r, g_r, var).clamp(min=tiny), sigma_dot(g_c, g_c, var).clamp(min=tiny)
    src = sigma_dot(g_r, g_c, var)
    onto_r = v - (vr / srr)[:, None] * g_r
    onto_c = v - (vc / scc)[:, None] * g_c
    det = (srr * scc - src**2).clamp(min=eps * srr * scc)
    a, b = (scc * vr - src * vc) / det, (srr * vc - src * vr) / det
    onto_both = v - a[:, None] * g_r - b[:, None] * g_c
    # Squared Sigma-distances moved; a candidate that leaves the other half-space is ruled out.
    inf = torch.full_like(vr, torch.inf)
    dist_r = torch.where((vr < 0) & (sigma_dot(onto_r, g_c, var) >= 0), vr**2 / srr, inf)
    dist_c = torch.where((vc < 0) & (sigma_dot(onto_c, g_r, var) >= 0), vc**2 / scc, inf)
    case = torch.where(
        (vr >= 0) & (vc >= 0),
        FEASIBLE,
        torch.where(dist_r.isinf() & dist_c.isinf(), ONTO_BOTH, torch.where(dist_r <= dist_c, ONTO_REWARD, ONTO_COST)),
    )
    projected = torch.where(
        (case == FEASIBLE)[:, None],
        v,
        torch.where(
            (case == ONTO_REWARD)[:, None], onto_r, torch.where((case == ONTO_COST)[:, None], onto_c, onto_both)
        ),
    )
    return projected, case


def trust_region_step(
    v: torch.Tensor, cost_grad: torch.Tensor, var: torch.Tensor, delta: torch.Tensor, slack: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean shift eta Sigma v with eta = delta / ||v||_Sigma (KL = delta^2 / 2), cut to
    slack / <cost_grad, v>_Sigma where the step raises the linearised cost (0 once out of slack);
    also whether the cut applied. A zero direction gives a zero step."""
    tiny = torch.finfo(v.dtype).tiny
    eta = delta / sigma_dot(v, v, var).clamp(min=tiny).sqrt()
    rise = sigma_dot(cost_grad, v, var)
    cap = (slack / rise.clamp(min=tiny)).clamp(min=0.0)
    cut = (rise > 0) & (cap < eta)
    return torch.where(cut, cap, eta)[:, None] * var * v, cut
