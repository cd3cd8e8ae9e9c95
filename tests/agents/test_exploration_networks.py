from __future__ import annotations

import torch

from q2real.agents.common.exploration import MixedGaussianNoise, NoiseRepetition
from q2real.agents.common.networks import Critic, EnsembleLinear, GaussianActor, project_weights
from q2real.agents.common.normalizer import ObsNormalizer


def test_mixed_noise_spreads_fixed_scales_or_redraws_them_per_episode() -> None:
    fixed = MixedGaussianNoise(5, 0.1, 0.5, resample_on_done=False, device="cpu")
    assert torch.allclose(fixed.sigma.squeeze(), torch.linspace(0.1, 0.5, 5))
    fixed.on_done(torch.ones(5, dtype=torch.bool))
    assert torch.allclose(fixed.sigma.squeeze(), torch.linspace(0.1, 0.5, 5))
    torch.manual_seed(0)
    redrawn = MixedGaussianNoise(1000, 0.1, 0.5, resample_on_done=True, device="cpu")
    before = redrawn.sigma.clone()
    done = torch.arange(1000) % 2 == 0
    redrawn.on_done(done)
    assert torch.equal(redrawn.sigma[~done], before[~done]) and not torch.equal(redrawn.sigma[done], before[done])
    assert redrawn.sigma.min() >= 0.1 and redrawn.sigma.max() <= 0.5
    noisy = redrawn.perturb(torch.zeros(1000, 2))
    assert noisy.abs().max() <= 1.0 and noisy.std() > 0.1


def test_noise_repetition_holds_noise_for_zeta_distributed_spans() -> None:
    torch.manual_seed(0)
    repeat = NoiseRepetition(2000, 1, mu=2.0, max_repeat=16, device="cpu")
    draws = torch.stack([repeat.next().clone() for _ in range(64)])  # (T, envs, 1)
    changes = (draws[1:] != draws[:-1]).float().sum(0).squeeze()  # resamples per env over 63 steps
    mean_span = 63 / changes.clamp_min(1)
    # E[k] for Zeta(2) truncated at 16 is sum(k^-1) / sum(k^-2) = 3.38 / 1.58 = 2.14.
    assert 1.8 < mean_span.mean().item() < 2.6
    repeat.on_done(torch.ones(2000, dtype=torch.bool))
    assert not torch.equal(repeat.next(), draws[-1])


def test_flash_networks_keep_unit_norm_rows_after_projection() -> None:
    critic = Critic(3, 1, (16, 16), "flash", 2, 5)
    with torch.no_grad():
        for p in critic.parameters():
            p.add_(torch.randn_like(p))
    project_weights(critic)
    units = [m for m in critic.modules() if isinstance(m, EnsembleLinear) and m.unit]
    assert units and all(torch.allclose(m.weight.norm(dim=1), torch.ones(1)) for m in units)
    assert critic(torch.randn(8, 3), torch.randn(8, 1)).shape == (2, 8, 5)


def test_tanh_gaussian_log_prob_matches_change_of_variables() -> None:
    torch.manual_seed(0)
    actor = GaussianActor(3, 2, (8,), "mlp", (-5.0, 2.0))
    obs = torch.randn(4, 3)
    noise = torch.randn(4, 2)
    action, log_prob = actor.sample(obs, noise)
    mean, log_std = actor.distribution(obs)
    base = torch.distributions.Normal(mean, log_std.exp())
    pre = mean + log_std.exp() * noise
    expected = (base.log_prob(pre) - torch.log(1 - torch.tanh(pre) ** 2)).sum(-1)
    assert torch.allclose(log_prob, expected, atol=1e-4) and torch.allclose(action, torch.tanh(pre))


def test_obs_normalizer_matches_batch_statistics() -> None:
    norm = ObsNormalizer(2)
    data = torch.randn(1000, 2) * torch.tensor([3.0, 0.5]) + torch.tensor([1.0, -2.0])
    for chunk in data.split(100):
        norm.update(chunk)
    assert torch.allclose(norm.mean, data.mean(0), atol=1e-3)
    assert torch.allclose(norm.var, data.var(0, unbiased=False), rtol=1e-3)
    assert torch.allclose(norm(data).mean(0), torch.zeros(2), atol=1e-3)
