from __future__ import annotations

import torch

from q2real.agents.common.heads import CategoricalHead, ScalarHead


def test_scalar_target_uses_min_over_critics_and_the_bonus() -> None:
    head = ScalarHead()
    out = torch.tensor([[[1.0], [0.0]], [[2.0], [0.0]]])  # (E=2, B=2, 1)
    target = torch.tensor([[[5.0], [3.0]], [[4.0], [7.0]]])
    reward, discount, bonus = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.0]), torch.tensor([-1.0, 9.0])
    # y = r + discount * (min(Q'_1, Q'_2) + bonus) = [1 + 0.5 * (4 - 1), 0] = [2.5, 0]
    expected = ((1.0 - 2.5) ** 2 + 0.0) / 2 + ((2.0 - 2.5) ** 2 + 0.0) / 2
    assert torch.isclose(head.loss(out, target, reward, discount, bonus)[0], torch.tensor(expected))


def test_categorical_projection_keeps_mass_and_mean() -> None:
    head = CategoricalHead(11, -5.0, 5.0)
    probs = torch.softmax(torch.randn(64, 11), -1)
    shift = torch.rand(64, 1) * 2 - 1
    shifted = head.atoms[None] * 0.8 + shift  # stays inside the support
    target = head.project(probs, shifted)
    assert torch.allclose(target.sum(-1), torch.ones(64))
    assert torch.allclose((target * head.atoms).sum(-1), (probs * shifted).sum(-1), atol=1e-5)
    # Values beyond the support land on its edges.
    edge = head.project(torch.eye(11)[:1], torch.full((1, 11), 50.0))
    assert edge[0, -1] == 1.0


def test_categorical_loss_is_minimised_by_the_projected_target() -> None:
    head = CategoricalHead(21, -10.0, 10.0)
    target_logits = torch.randn(2, 8, 21)
    reward, discount, bonus = torch.randn(8), torch.full((8,), 0.9), torch.zeros(8)
    pick = head.q(target_logits).argmin(0)
    probs = target_logits.softmax(-1)[pick, torch.arange(8)]
    wanted = head.project(probs, reward[:, None] + 0.9 * head.atoms[None])
    logits = torch.zeros(2, 8, 21, requires_grad=True)
    optim = torch.optim.Adam([logits], lr=0.1)
    for _ in range(500):
        optim.zero_grad()
        head.loss(logits, target_logits, reward, discount, bonus)[0].backward()
        optim.step()
    assert torch.allclose(logits.softmax(-1)[0], wanted, atol=2e-2)
