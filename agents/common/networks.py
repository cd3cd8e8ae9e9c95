"""Network blocks. Every layer carries a leading ensemble dimension E, so twin (or more) critics run
as one fused batched matmul instead of E separate modules; an actor is simply E = 1.

Tensors flow as (E, B, features). Four trunks share the interface:
  mlp        Linear -> act, the SAC/TD3 papers' default
  layernorm  Linear -> LayerNorm -> act, FastSAC-style stabilisation
  renorm     BatchRenorm on the input, then Linear -> ReLU -> BatchRenorm per layer (CrossQ, Bhatt
             et al. 2024, Sec. 3 and their `sbx` policies: the layer order and the renorm settings)
  flash      FlashSAC (Kim et al. 2026, Sec. 3): BatchNorm -> unit-norm linear embedding, inverted
             residual blocks x + ReLU(BN(W2 ReLU(BN(W1 x)))) with W1: h -> 4h, W2: 4h -> h, then RMSNorm;
             weight rows are projected back to unit norm after every optimizer step (`project_weights`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Literal

import torch
from torch import nn

Trunk = Literal["mlp", "layernorm", "flash", "renorm"]


class EnsembleLinear(nn.Module):
    """E independent linear layers applied as one batched matmul."""

    matmul_dtype: torch.dtype | None = None
    """bfloat16: the product runs on bfloat16 copies of input and weight (float32 accumulation in the
    kernel), its result rounded to bfloat16 and returned as float32 with the bias added in float32;
    the weights and their gradients' storage stay float32, their gradients carry bfloat16 precision.
    None: float32 throughout."""

    def __init__(self, ensemble: int, in_features: int, out_features: int, bias: bool = True, unit: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(ensemble, in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(ensemble, 1, out_features)) if bias else None
        self.unit = unit
        bound = 1 / math.sqrt(in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        if unit:
            self.project()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = self.matmul_dtype
        if low is not None:
            out = torch.bmm(x.to(low), self.weight.to(low)).float()
            return out if self.bias is None else out + self.bias
        if self.bias is None:
            return torch.bmm(x, self.weight)
        return torch.baddbmm(self.bias, x, self.weight)

    @torch.no_grad()
    def project(self) -> None:
        """Unit L2 norm for each output unit's weight vector (FlashSAC's weight-norm bounding)."""
        self.weight.div_(self.weight.norm(dim=1, keepdim=True).clamp_min(1e-8))


class EnsembleLayerNorm(nn.Module):
    def __init__(self, ensemble: int, features: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(ensemble, 1, features))
        self.shift = nn.Parameter(torch.zeros(ensemble, 1, features))
        self.features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A constant shape, not x.shape[-1:]: the ONNX exporter cannot take a traced shape here.
        return nn.functional.layer_norm(x, (self.features,)) * self.scale + self.shift


class EnsembleBatchNorm(nn.Module):
    """BatchNorm over the batch dimension with separate statistics and affine terms per member."""

    running_mean: torch.Tensor
    running_var: torch.Tensor

    def __init__(self, ensemble: int, features: int, momentum: float = 0.01, eps: float = 1e-5):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(ensemble, 1, features))
        self.shift = nn.Parameter(torch.zeros(ensemble, 1, features))
        self.register_buffer("running_mean", torch.zeros(ensemble, 1, features))
        self.register_buffer("running_var", torch.ones(ensemble, 1, features))
        self.momentum, self.eps = momentum, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[1] > 1:
            mean = x.mean(dim=1, keepdim=True)
            # E[x^2] - E[x]^2: two plain means are ~10x faster on CPU than a strided var() over dim 1.
            var = (x * x).mean(dim=1, keepdim=True).sub_(mean * mean).clamp_min_(0.0)
            with torch.no_grad():
                self.running_mean.lerp_(mean, self.momentum)
                self.running_var.lerp_(var, self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean) * torch.rsqrt(var + self.eps) * self.scale + self.shift

    @torch.no_grad()
    def project(self) -> None:
        d = self.scale.shape[-1]
        self.scale.mul_(math.sqrt(d) / self.scale.norm(dim=-1, keepdim=True).clamp_min(1e-8))


class EnsembleBatchRenorm(EnsembleBatchNorm):
    """Batch renormalization (Ioffe 2017), as CrossQ uses it: in training, x is normalized with the
    batch's statistics and then corrected towards the running ones by r = sigma_B / sigma and
    d = (mu_B - mu) / sigma, clipped to [1/r_max, r_max] and [-d_max, d_max] and not differentiated,
    so a prediction no longer depends on which other samples share its batch. For the first `warmup`
    training passes r = 1 and d = 0 (plain BatchNorm), while the running statistics settle.
    Evaluation uses the running statistics, as BatchNorm does.
    """

    steps: torch.Tensor

    def __init__(
        self,
        ensemble: int,
        features: int,
        momentum: float = 0.01,
        eps: float = 1e-3,
        r_max: float = 3.0,
        d_max: float = 5.0,
        warmup: int = 100_000,
    ):
        super().__init__(ensemble, features, momentum, eps)
        self.r_max, self.d_max, self.warmup = r_max, d_max, warmup
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and x.shape[1] > 1):
            return super().forward(x)
        mean = x.mean(dim=1, keepdim=True)
        var = (x * x).mean(dim=1, keepdim=True).sub_(mean * mean).clamp_min_(0.0)
        inv_std = torch.rsqrt(var + self.eps)
        with torch.no_grad():
            running_std = (self.running_var + self.eps).sqrt()
            # Without a host sync: a 0/1 gate on the step count instead of a Python branch.
            on = (self.steps >= self.warmup).to(x.dtype)
            r = 1 + on * ((1 / (inv_std * running_std)).clamp(1 / self.r_max, self.r_max) - 1)
            d = on * ((mean - self.running_mean) / running_std).clamp(-self.d_max, self.d_max)
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var, self.momentum)
            self.steps += 1
        # ((x - mean) / std * r + d) * scale + shift, folded into one multiply-add over the batch: the
        # per-feature factors are small, and elementwise passes over (E, B, F) cost more than the matmuls.
        gain = inv_std * r * self.scale
        return torch.addcmul((d - mean * inv_std * r) * self.scale + self.shift, x, gain)


class EnsembleRMSNorm(nn.Module):
    def __init__(self, ensemble: int, features: int, eps: float = 1e-6):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(ensemble, 1, features))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.scale

    @torch.no_grad()
    def project(self) -> None:
        d = self.scale.shape[-1]
        self.scale.mul_(math.sqrt(d) / self.scale.norm(dim=-1, keepdim=True).clamp_min(1e-8))


class InvertedResidual(nn.Module):
    def __init__(self, ensemble: int, hidden: int, momentum: float):
        super().__init__()
        self.up = EnsembleLinear(ensemble, hidden, 4 * hidden, bias=False, unit=True)
        self.norm_up = EnsembleBatchNorm(ensemble, 4 * hidden, momentum)
        self.down = EnsembleLinear(ensemble, 4 * hidden, hidden, bias=False, unit=True)
        self.norm_down = EnsembleBatchNorm(ensemble, hidden, momentum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm_up(self.up(x)))
        return x + torch.relu(self.norm_down(self.down(h)))


def trunk(kind: Trunk, ensemble: int, in_features: int, hidden: tuple[int, ...], dropout: float = 0.0) -> nn.Sequential:
    """Feature extractor (E, B, in) -> (E, B, hidden[-1]). For `flash`, hidden = (width,) * blocks.
    `dropout` follows each hidden layer's linear map (DroQ's Linear -> Dropout -> LayerNorm -> act)."""
    if kind == "flash":
        width = hidden[0]
        layers: list[nn.Module] = [
            EnsembleBatchNorm(ensemble, in_features),
            EnsembleLinear(ensemble, in_features, width, bias=False, unit=True),
        ]
        layers += [InvertedResidual(ensemble, width, momentum=0.01) for _ in hidden]
        layers.append(EnsembleRMSNorm(ensemble, width))
        return nn.Sequential(*layers)
    layers = [EnsembleBatchRenorm(ensemble, in_features)] if kind == "renorm" else []
    for width in hidden:
        layers.append(EnsembleLinear(ensemble, in_features, width))
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        if kind == "layernorm":
            layers.append(EnsembleLayerNorm(ensemble, width))
        layers.append(nn.SiLU() if kind == "layernorm" else nn.ReLU())
        if kind == "renorm":
            layers.append(EnsembleBatchRenorm(ensemble, width))
        in_features = width
    return nn.Sequential(*layers)


def set_renorm_warmup(module: nn.Module, warmup: int) -> None:
    """Training passes every batch-renorm layer in `module` runs as plain BatchNorm before it corrects."""
    for layer in module.modules():
        if isinstance(layer, EnsembleBatchRenorm):
            layer.warmup = warmup


def set_matmul_dtype(module: nn.Module, dtype: torch.dtype | None) -> None:
    """Every hidden linear layer in `module` multiplies in `dtype` (None: float32; see `EnsembleLinear`).
    Output layers (`head`) stay float32: they cost little, and Q values and actions keep full precision."""
    for name, layer in module.named_modules():
        if isinstance(layer, EnsembleLinear) and name.split(".")[-1] != "head":
            layer.matmul_dtype = dtype


@contextlib.contextmanager
def float32_matmuls(module: nn.Module) -> Iterator[None]:
    """Within the block every linear layer in `module` multiplies in float32, as an exported graph
    does; then each goes back to its own setting."""
    layers = [layer for layer in module.modules() if isinstance(layer, EnsembleLinear)]
    saved = [layer.matmul_dtype for layer in layers]
    set_matmul_dtype(module, None)
    try:
        yield
    finally:
        for layer, dtype in zip(layers, saved, strict=True):
            layer.matmul_dtype = dtype


@torch.no_grad()
def project_weights(module: nn.Module) -> None:
    """Re-apply FlashSAC's norm bounds to every unit-norm layer and norm scale in `module`."""
    for layer in module.modules():
        if isinstance(layer, EnsembleLinear) and layer.unit or isinstance(layer, EnsembleBatchNorm | EnsembleRMSNorm):
            layer.project()


class Critic(nn.Module):
    """E action-value networks Q_i(s, a) evaluated together; each outputs `out_features` values
    (1 for a scalar Q, the atom count for a categorical critic)."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: tuple[int, ...],
        kind: Trunk,
        ensemble: int,
        out: int,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.ensemble = ensemble
        self.body = trunk(kind, ensemble, obs_dim + action_dim, hidden, dropout)
        self.head = EnsembleLinear(ensemble, hidden[-1] if kind != "flash" else hidden[0], out)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], dim=-1)
        x = x.expand(self.ensemble, *x.shape) if x.dim() == 2 else x
        return self.head(self.body(x))


def policy_input(obs: torch.Tensor, dim: int) -> torch.Tensor:
    """The policy's leading `dim` columns of an observation that also carries critic-only terms."""
    # An export traces the bundle's input, exactly the policy's width: no slice goes into the graph.
    if torch.jit.is_tracing():  # pyright: ignore[reportPrivateImportUsage]
        return obs
    return obs if obs.shape[-1] == dim else obs[..., :dim]


class DeterministicActor(nn.Module):
    """a = tanh(f(s)) (TD3/DDPG)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], kind: Trunk):
        super().__init__()
        self.obs_dim = obs_dim
        self.body = trunk(kind, 1, obs_dim, hidden)
        self.head = EnsembleLinear(1, hidden[-1] if kind != "flash" else hidden[0], action_dim)
        with torch.no_grad():
            self.head.weight.mul_(0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.body(policy_input(obs, self.obs_dim).unsqueeze(0)))).squeeze(0)


class GaussianActor(nn.Module):
    """Tanh-squashed Gaussian policy (SAC, Haarnoja et al. 2018, App. C): a = tanh(mu + sigma * eps)."""

    def __init__(
        self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], kind: Trunk, log_std: tuple[float, float]
    ):
        super().__init__()
        self.obs_dim = obs_dim
        self.body = trunk(kind, 1, obs_dim, hidden)
        self.head = EnsembleLinear(1, hidden[-1] if kind != "flash" else hidden[0], 2 * action_dim)
        self.action_dim = action_dim
        self.log_std_min, self.log_std_max = log_std

    def distribution(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.head(self.body(policy_input(obs, self.obs_dim).unsqueeze(0))).squeeze(0)
        # Constant slices, not chunk(2): an exported chunk reads the width from the tensor at run time.
        mean, raw = out[..., : self.action_dim], out[..., self.action_dim :]
        # Smooth squash of log-std into its bounds keeps gradients alive at the edges.
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (torch.tanh(raw) + 1)
        return mean, log_std

    def sample(self, obs: torch.Tensor, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised action and its log-probability, with the tanh change of variables (SAC eq. 26)."""
        mean, log_std = self.distribution(obs)
        if noise is None:
            noise = torch.randn_like(mean)
        pre_tanh = mean + log_std.exp() * noise
        action = torch.tanh(pre_tanh)
        log_prob = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log(1 - tanh(u)^2) written stably as 2 (log 2 - u - softplus(-2u)).
        log_prob = log_prob - (2 * (math.log(2) - pre_tanh - nn.functional.softplus(-2 * pre_tanh))).sum(-1)
        return action, log_prob

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic action tanh(mu): what evaluation and export use."""
        return torch.tanh(self.distribution(obs)[0])


@torch.no_grad()
def polyak(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- (1 - tau) target + tau online, for parameters; buffers (norm statistics) are copied."""
    target_params: list[torch.Tensor] = list(target.parameters())
    online_params: list[torch.Tensor] = list(online.parameters())
    torch._foreach_lerp_(target_params, online_params, tau)  # pyright: ignore[reportPrivateImportUsage]
    for t, o in zip(target.buffers(), online.buffers(), strict=True):
        t.copy_(o)


@torch.no_grad()
def average_weights(average: nn.Module, online: nn.Module, tau: float) -> None:
    """average <- (1 - tau) average + tau online, for parameters and floating-point buffers alike: the
    normalization statistics are averaged with the weights they normalize. Counters are copied."""
    mine, theirs = [*average.parameters(), *average.buffers()], [*online.parameters(), *online.buffers()]
    pairs = list(zip(mine, theirs, strict=True))
    floats = [(a, o) for a, o in pairs if a.is_floating_point()]
    torch._foreach_lerp_([a for a, _ in floats], [o for _, o in floats], tau)  # pyright: ignore[reportPrivateImportUsage]
    for a, o in pairs:
        if not a.is_floating_point():
            a.copy_(o)
