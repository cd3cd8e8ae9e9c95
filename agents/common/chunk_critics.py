"""Action-chunk critics: value h actions at once, so one backup spans h steps.

Three critics over the same replay windows (`ReplayStorage.gather` with `chunk`):

- `qc`, Q-chunking (Li, Zhou & Levine 2025, its chunked TD target): Q(s_t, a_{t:t+h}) regresses to
  sum_{k<h} gamma^k r_{t+k} + gamma^h Q'(s_{t+h}, a'_{t+h:t+2h}), a' the policy's chunk at s_{t+h}.
  QC's policy is best-of-N from a behaviour-cloned flow policy; online here, the chunk is the
  SAC (tanh-Gaussian over all h x |A| numbers) or TD3 actor's output: QC-RLPD without its
  demonstrations and BC term.
- `dqc`, decoupled Q-chunking (Li, Park & Levine 2025): the critic values the long chunk as in QC,
  the policy predicts only a prefix of p actions. A distilled critic Q_p(s, a_{t:t+p}) is fitted to
  the chunk critic by expectile regression (kappa > 1/2: an optimistic max over the unseen suffix),
  the actor maximizes Q_p, and the chunk target bootstraps from V(s') = Q_p'(s', pi(s')). DQC's
  separate value net and BCE losses (for its [0, 1] goal rewards) are replaced by this policy-based
  value and squared losses, which suit online SAC on unbounded rewards: our departure.
- `multi`, a multi-horizon critic (SEAR, Nagy et al. 2026; T-SAC, Tian et al. 2026): a causal
  transformer over [s, a_1, ..., a_h] whose k-th action token predicts Q(s, a_{1:k}); every prefix
  regresses to its own k-step target sum_{j<k} gamma^j r_{t+j} + gamma^k V(s_{t+k}). SEAR's exact
  layers and target are not public; this is our reading. V and the actor use the prefix the robot
  executes (`execute` actions, then replan), which is the value of the receding-horizon policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from q2real.agents.common.networks import EnsembleLayerNorm, EnsembleLinear
from q2real.agents.common.replay import Batch
from q2real.contracts.chunks import MAX_CHUNK, ChunkSpec

if TYPE_CHECKING:
    from q2real.agents.common.actor_critic import ActorCritic


@dataclass
class ChunkConfig:
    """Action chunks: how many actions the critic values and the policy predicts, and how they run."""

    size: int = 1
    """Actions per chunk the critic values, which is also the backup's length (h; 1 = per-step learner)."""
    critic: Literal["qc", "dqc", "multi"] = "qc"
    """How chunks are valued: `qc`, one Q over the whole chunk (Q-chunking); `dqc`, that critic plus
    one distilled onto the policy's shorter prefix (`policy_size`, decoupled Q-chunking); `multi`, a
    causal transformer that values every prefix of the chunk (multi-horizon)."""
    policy_size: int = 0
    """dqc: actions the policy predicts, a prefix of the critic's chunk (0 = size; required < size)."""
    execute: int = 0
    """Ticks between policy queries in training, evaluation and on the robot (0 = the policy's whole chunk)."""
    ensemble: float | None = None
    """ACT temporal-ensembling coefficient for overlapping chunks (null: a new chunk replaces the queue)."""
    expectile: float = 0.8
    """dqc: the distillation expectile kappa (DQC's cube command uses 0.8)."""
    width: int = 64
    """multi: the transformer's model width (T-SAC uses 128-256; at 64 a CPU update took ~120 ms, h = 4)."""
    layers: int = 2
    """multi: transformer blocks of each critic."""
    heads: int = 4
    """multi: attention heads per block; `width` must be a multiple of it."""

    @property
    def policy_length(self) -> int:
        """Actions the policy outputs per query."""
        return self.policy_size if self.critic == "dqc" and self.policy_size else self.size

    def spec(self) -> ChunkSpec:
        """How the policy's chunks are executed, as the bundle records it."""
        return ChunkSpec(self.policy_length, self.execute or self.policy_length, self.ensemble)

    def checks(self) -> list[tuple[bool, str, str]]:
        policy, spec = self.policy_length, ChunkSpec(self.policy_length, self.execute or 1, self.ensemble)
        return [
            (1 <= self.size <= MAX_CHUNK, "chunk.size", f"in [1, {MAX_CHUNK}]"),
            (self.critic != "dqc" or 1 <= self.policy_size < self.size, "chunk.policy_size", "in [1, size) for dqc"),
            (self.critic == "dqc" or self.policy_size == 0, "chunk.policy_size", "0 unless critic=dqc"),
            (0 <= self.execute <= policy, "chunk.execute", f"in [0, {policy}] (0 = the whole chunk)"),
            (all(key != "ensemble" for key, _ in spec.problems()), "chunk.ensemble", "null or in [-1, 1]"),
            (0.5 <= self.expectile < 1, "chunk.expectile", "in [0.5, 1)"),
            (
                self.width >= 1 and self.heads >= 1 and self.width % self.heads == 0,
                "chunk.width",
                "a multiple of heads",
            ),
            (self.layers >= 1, "chunk.layers", ">= 1"),
        ]


class CausalChunkCritic(nn.Module):
    """E causal transformers over [s, a_1 .. a_h], run as one batched pass (E leads every tensor, as in
    `networks`): (obs (B, S), chunk (B, k * A)) -> (E, B, k, out), entry j - 1 being Q(s, a_{1:j});
    token j attends to the state and actions 1..j only, so a chunk's first k <= h actions suffice for
    its first k values (what targets and the actor need). Pre-norm blocks, no dropout."""

    def __init__(self, obs_dim: int, action_dim: int, size: int, ensemble: int, out: int, config: ChunkConfig):
        super().__init__()
        self.ensemble, self.action_dim, self.size, self.heads = ensemble, action_dim, size, config.heads
        width = config.width
        self.state = EnsembleLinear(ensemble, obs_dim, width)
        self.action = EnsembleLinear(ensemble, action_dim, width)
        self.position = nn.Parameter(torch.randn(ensemble, 1, size + 1, width) * 0.02)
        self.blocks = nn.ModuleList(_CausalBlock(ensemble, width, config.heads) for _ in range(config.layers))
        self.norm = EnsembleLayerNorm(ensemble, width)
        self.head = EnsembleLinear(ensemble, width, out)

    def forward(self, obs: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
        e, batch, size = self.ensemble, obs.shape[0], chunk.shape[-1] // self.action_dim
        state = self.state(obs.expand(e, *obs.shape)).unsqueeze(2)  # (E, B, 1, W)
        actions = chunk.reshape(1, batch * size, self.action_dim).expand(e, -1, -1)
        tokens = torch.cat([state, self.action(actions).view(e, batch, size, -1)], dim=2)
        tokens = tokens + self.position[:, :, : size + 1]
        for block in self.blocks:
            tokens = block(tokens)
        values = tokens[:, :, 1:].reshape(e, batch * size, -1)
        return self.head(self.norm(values)).view(e, batch, size, -1)


class _CausalBlock(nn.Module):
    def __init__(self, ensemble: int, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm_attention = EnsembleLayerNorm(ensemble, width)
        self.qkv = EnsembleLinear(ensemble, width, 3 * width)
        self.out = EnsembleLinear(ensemble, width, width)
        self.norm_mlp = EnsembleLayerNorm(ensemble, width)
        self.up = EnsembleLinear(ensemble, width, 2 * width)
        self.down = EnsembleLinear(ensemble, 2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e, batch, tokens, width = x.shape
        flat = x.reshape(e, batch * tokens, width)
        qkv = self.qkv(self.norm_attention(flat)).view(e * batch, tokens, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (E * B, heads, T, W / heads)
        # Plain attention: at a handful of tokens it ran a little faster on the CPU than the fused kernel
        # (the whole critic's forward, batch 256, h = 4, width 64: 17.3 ms against 18.9 ms).
        scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
        causal = torch.ones(tokens, tokens, dtype=torch.bool, device=x.device).tril()
        attended = scores.masked_fill(~causal, -math.inf).softmax(dim=-1) @ v
        flat = flat + self.out(attended.transpose(1, 2).reshape(e, batch * tokens, width))
        flat = flat + self.down(torch.relu(self.up(self.norm_mlp(flat))))
        return flat.view(e, batch, tokens, width)


def expectile_loss(prediction: torch.Tensor, target: torch.Tensor, kappa: float) -> torch.Tensor:
    """sum over members of mean |kappa - 1(u < 0)| u^2, u = target - prediction (IQL's expectile loss)."""
    u = target - prediction
    return (torch.where(u < 0, 1 - kappa, kappa) * u.pow(2)).mean(dim=-1).sum()


def multi_horizon_loss(agent: ActorCritic, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Every prefix k of the stored chunk regresses to its own k-step target (the head's clipped
    double-Q loss on all B x h predictions at once); each sample's |TD error| is its largest over prefixes."""
    prefixes = batch.prefixes
    assert prefixes is not None, "multi-horizon critics train on chunk windows (gather with chunk > 1)"
    assert agent.critic_target is not None, "chunk.critic=multi keeps a target critic"
    batch_size, size = prefixes.reward.shape
    obs = agent.obs_norm(batch.obs)
    next_obs = agent.obs_norm(prefixes.next_obs.flatten(0, 1))
    reward = prefixes.reward.flatten() / agent.return_scale.scale()
    with torch.no_grad():
        next_action, bonus = agent.target_action(next_obs)
        executed = agent.config.chunk.spec().execute * agent.action_dim
        target_out = agent.critic_target(next_obs, next_action[:, :executed])[:, :, -1]
    out = agent.critic(obs, batch.action).flatten(1, 2)
    weight = batch.weight.repeat_interleave(size) if batch.weight is not None else None
    loss, td_abs = agent.head.loss(out, target_out, reward, prefixes.discount.flatten(), bonus, weight)
    return loss, td_abs.view(batch_size, size).amax(dim=1)


def decoupled_loss(agent: ActorCritic, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """DQC: the chunk critic's h-step TD loss, bootstrapped from the prefix critic at s_{t+h}, plus the
    prefix critic's expectile regression to the (detached, min over members) chunk critic."""
    assert agent.prefix_critic is not None and agent.prefix_target is not None, "dqc builds a prefix critic"
    obs, next_obs = agent.obs_norm(batch.obs), agent.obs_norm(batch.next_obs)
    reward = batch.reward / agent.return_scale.scale()
    with torch.no_grad():
        next_action, bonus = agent.target_action(next_obs)
        target_out = agent.prefix_target(next_obs, next_action)
    out = agent.critic(obs, batch.action)
    chunk_loss, td_abs = agent.head.loss(out, target_out, reward, batch.discount, bonus, batch.weight)
    chunk_q = agent.head.q(out.detach()).min(dim=0).values
    prefix_q = agent.head.q(agent.prefix_critic(obs, batch.action[:, : agent.policy_dim]))
    distill = expectile_loss(prefix_q, chunk_q.expand_as(prefix_q), agent.config.chunk.expectile)
    return chunk_loss + distill, td_abs
