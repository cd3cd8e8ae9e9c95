"""The update every off-policy actor-critic here shares; algorithms fill in four pieces.

An algorithm subclasses `ActorCritic` and provides: its actor, the exploration rule (`explore`),
the bootstrap action and entropy bonus (`target_action`), and the actor loss (`actor_loss`, plus
any extra losses such as SAC's temperature). The critic ensemble, value head (scalar or C51),
n-step targets, observation normalization, reward scaling, delayed actor updates, Polyak averaging
and FlashSAC's weight projection live here once.
"""

from __future__ import annotations

import copy
import functools
import math
import shutil
from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import torch
from torch import nn
from torch.optim.adam import adam

from q2real.agents.common.anchor import Anchor
from q2real.agents.common.chunk_critics import CausalChunkCritic, ChunkConfig, decoupled_loss, multi_horizon_loss
from q2real.agents.common.heads import CategoricalHead, QuantileHead, ScalarHead
from q2real.agents.common.networks import (
    Critic,
    Trunk,
    average_weights,
    polyak,
    project_weights,
    set_matmul_dtype,
)
from q2real.agents.common.normalizer import Gather, ObsNormalizer, ReturnScaler, local
from q2real.agents.common.replay import Batch
from q2real.sim.vec_env import StepResult, VecEnv

T = TypeVar("T")
COMPILE_OPTIONS: dict[str, str | int | bool | Callable[..., Any]] = {"cpp.dynamic_threads": True}
"""Inductor settings of a compiled step. Its CPU kernels read the thread count when they run rather than
baking in the one they were compiled with, so the training loop's thread tuning reaches them."""


@dataclass
class ActorCriticConfig:
    """Settings shared by every actor-critic learner."""

    gamma: float = 0.99
    """Discount per env step; a backup of n steps (`n_step`, a chunk) bootstraps with gamma^n. Lower
    (0.97) shortens the horizon the critic must predict, higher values a longer one."""
    tau: float = 0.005
    """Polyak rate of the target critic."""
    batch_size: int = 256
    """Transitions per gradient update of the critics and the actor."""
    n_step: int = 1
    """Rewards summed (discounted) before the TD target bootstraps: more spreads a sparse reward back
    faster, at the price of bias from the older policy's actions. 1 with action chunks (their length is
    the backup)."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critics."""
    weight_decay: float = 0.0
    """AdamW weight decay (0 = Adam)."""
    adam_beta1: float = 0.9
    """Adam's first-moment decay for the actor and critics (CrossQ: 0.5)."""
    actor_hidden: tuple[int, ...] = (256, 256)
    """The actor's hidden layer widths; for the `flash` trunk, one entry per inverted-residual block."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Layer widths; for the `flash` trunk, one entry per inverted-residual block."""
    network: Trunk = "mlp"
    """Hidden-layer trunk of the actor, and of the critics unless `critic_network` is set: `mlp`,
    `layernorm` (LayerNorm in every layer), `renorm` (batch renormalization, CrossQ) or `flash`
    (FlashSAC's normalized inverted-residual blocks)."""
    critic_network: Trunk | None = None
    """The critics' trunk where it differs from the actor's (DroQ: layernorm critics, an mlp actor);
    None: `network`."""
    critic_dropout: float = 0.0
    """Dropout after each hidden linear map of the critics (DroQ: 0.01), in the target critic too."""
    num_critics: int = 2
    """Critics in the ensemble; the TD target takes the pessimistic one (clipped double Q with 2)."""
    target_subset: int = 0
    """Bootstrap from the minimum over a random subset of this many target critics, drawn per update
    (REDQ/RLPD: 10 critics, subsets of 2); 0 = the minimum over all of them."""
    policy_delay: int = 1
    """Critic updates per actor update."""
    critic_head: Literal["scalar", "categorical", "quantile"] = "scalar"
    """What each critic predicts: a `scalar` Q value, a `categorical` distribution over `num_atoms`
    fixed returns in [v_min, v_max] (C51, as FastTD3 and FlashSAC) or `num_quantiles` return
    `quantile`s (QR-DQN, targets pooled over the ensemble as TQC)."""
    huber: bool = False
    """Huber instead of squared TD error (scalar head)."""
    num_atoms: int = 101
    """Atoms of the categorical head's support, evenly spaced on [v_min, v_max]."""
    num_quantiles: int = 32
    """Quantiles per critic member (quantile head)."""
    drop_top: int = 0
    """Quantile head: target atoms dropped per member from the top of the pooled target (TQC)."""
    v_min: float = -250.0
    """Lowest return the categorical head represents (targets are clipped into [v_min, v_max]): the
    support must cover the task's discounted returns, or those after `scale_rewards`."""
    v_max: float = 250.0
    """Highest return the categorical head represents; with `scale_rewards`, also the bound the scaled
    discounted returns are fitted into."""
    normalize_obs: bool = True
    """Normalize observations by their running mean and variance (clipped to +-10 std); the statistics
    are saved with checkpoints and baked into the exported bundle."""
    scale_rewards: bool = False
    """FlashSAC return-based reward scaling (pairs with a categorical head on [-v_max, v_max])."""
    project_weights: bool = False
    """Project weight rows to unit norm after each step (FlashSAC; needs network=flash)."""
    max_grad_norm: float = 0.0
    """Clip gradient norm (0 = off)."""
    cross_batch: bool = False
    """Run online and target critics on (s, a) and (s', a') as one batch, so BatchNorm statistics are
    shared between predictions and targets (FlashSAC's cross-batch value prediction)."""
    target_network: bool = True
    """False: no target critic; the TD target is the online critic's own (detached) value of (s', a')
    from the same joint forward pass as Q(s, a) (CrossQ; needs cross_batch)."""
    matmul_dtype: Literal["float32", "bfloat16"] = "float32"
    """bfloat16: the hidden layers' matrix products (forward and backward) run in bfloat16 with float32
    accumulation, as FastTD3's mixed precision: their results and gradients carry bfloat16's 8
    significant bits. Output layers (Q values, actions), weights, optimizer state, normalization
    statistics and losses stay float32, and exported policies run float32. On CPUs with AVX-512 BF16
    or AMX (and any recent GPU) a product costs about half; elsewhere it can cost more."""
    actor_average: float = 0.0
    """Polyak rate, per actor step, of an averaged copy of the actor that deterministic actions come from
    (evaluation, checkpoints' judged policy, the exported bundle); exploration still uses the online
    actor. Averaging recent iterates' weights damps a policy that swings between good and bad from one
    evaluation to the next (Nikishin et al. 2018, "Improving Stability in Deep Reinforcement Learning
    with Weight Averaging"). 0 = off: the online actor is the policy."""
    compile: bool = False
    """Run each critic step and each actor step as one compiled graph (torch.compile, inductor): the
    forward and backward passes, gradient clipping, Adam and the target networks' averaging, with the
    elementwise work fused and no Python between operations, which on a CPU is most of an update that is
    not a matrix product. The first update compiles (tens of seconds on a CPU, again for a new batch shape);
    random draws inside a step come from inductor's generator, so a compiled run matches an eager one in
    distribution, not bit for bit. CPUs need a C++ compiler; not with data-parallel training."""
    chunk: ChunkConfig = field(default_factory=ChunkConfig)
    """Action chunks: the policy predicts several actions per query and the critic values them together."""

    def checks(self) -> list[tuple[bool, str, str]]:
        """(holds, key, what is expected) for every range rule; subclasses extend the list."""
        return [
            (0 < self.gamma <= 1, "gamma", "in (0, 1]"),
            (0 < self.tau <= 1, "tau", "in (0, 1]"),
            (self.batch_size >= 2, "batch_size", ">= 2"),
            (self.n_step >= 1, "n_step", ">= 1"),
            (_positive(self.actor_lr), "actor_lr", "> 0 and finite"),
            (_positive(self.critic_lr), "critic_lr", "> 0 and finite"),
            (0 <= self.weight_decay < math.inf, "weight_decay", ">= 0 and finite"),
            (0 <= self.adam_beta1 < 1, "adam_beta1", "in [0, 1)"),
            (_widths(self.actor_hidden), "actor_hidden", "one or more widths, each >= 1"),
            (_widths(self.critic_hidden), "critic_hidden", "one or more widths, each >= 1"),
            # The flash trunk has one width for every block; the others would be silently ignored.
            (self.network != "flash" or len(set(self.actor_hidden)) == 1, "actor_hidden", "equal widths (flash)"),
            (
                self.critic_trunk != "flash" or len(set(self.critic_hidden)) == 1,
                "critic_hidden",
                "equal widths (flash)",
            ),
            (0 <= self.critic_dropout < 1, "critic_dropout", "in [0, 1)"),
            (self.critic_dropout == 0 or self.critic_trunk != "flash", "critic_dropout", "0 for the flash trunk"),
            (self.num_critics >= 1, "num_critics", ">= 1"),
            (0 <= self.target_subset <= self.num_critics, "target_subset", f"in [0, num_critics={self.num_critics}]"),
            (self.target_subset == 0 or self.chunk.critic == "qc", "target_subset", "0 for chunk.critic dqc/multi"),
            (self.policy_delay >= 1, "policy_delay", ">= 1"),
            (self.critic_head != "categorical" or self.num_atoms >= 2, "num_atoms", ">= 2 (categorical head)"),
            (self.num_quantiles >= 1, "num_quantiles", ">= 1"),
            (0 <= self.drop_top < self.num_quantiles, "drop_top", f"in [0, num_quantiles={self.num_quantiles})"),
            (-math.inf < self.v_min < self.v_max < math.inf, "v_min", "finite and < v_max"),
            (0 <= self.max_grad_norm < math.inf, "max_grad_norm", ">= 0 and finite"),
            (0 <= self.actor_average <= 1, "actor_average", "in [0, 1]"),
            (not self.project_weights or self.network == "flash", "project_weights", "used with network=flash"),
            *self.chunk.checks(),
            (self.chunk.size == 1 or self.n_step == 1, "n_step", "1 with chunks (the backup spans chunk.size steps)"),
            (
                self.chunk.critic == "qc" or self.critic_head == "scalar",
                "critic_head",
                "scalar for chunk.critic dqc/multi",
            ),
            (self.chunk.critic == "qc" or not self.cross_batch, "cross_batch", "false for chunk.critic dqc/multi"),
            (self.target_network or self.cross_batch, "target_network", "true unless cross_batch is true"),
        ]

    @property
    def critic_trunk(self) -> Trunk:
        return self.critic_network or self.network

    def validate(self, where: str) -> None:
        for ok, key, expected in self.checks():
            if not ok:
                value = functools.reduce(getattr, key.split("."), self)
                raise ValueError(f"{where}.{key}: expected {expected}, got {value!r}")


def _positive(value: float) -> bool:
    return 0 < value < math.inf


def _widths(hidden: tuple[int, ...]) -> bool:
    return len(hidden) > 0 and all(width >= 1 for width in hidden)


def make_optimizer(params, lr: float, weight_decay: float, beta1: float = 0.9) -> torch.optim.Optimizer:
    """Adam, or AdamW with weight decay; fused kernels (one launch for all tensors) where supported.
    Its state is made here, not on the first step, so a compiled step finds it (`traced_step`)."""
    params = list(params)
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    betas = (beta1, 0.999)
    if weight_decay > 0:
        optim = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused)
    else:
        optim = torch.optim.Adam(params, lr=lr, betas=betas, fused=fused)
    # What Adam's first step would make for these settings: fused, a float32 step count on the
    # parameter's device; otherwise one on the CPU in the default dtype.
    dtype = torch.float32 if fused else torch.get_default_dtype()
    for p in params:
        step = torch.zeros((), dtype=dtype, device=p.device if fused else "cpu")
        optim.state[p] = {"step": step, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    return optim


@torch.no_grad()
def traced_step(optim: torch.optim.Optimizer) -> None:
    """`optim.step()` (Adam or AdamW) as plain tensor operations that torch.compile traces into the step's
    graph: torch.optim's own step breaks a compiled graph on purpose and its fused kernel cannot be
    traced. The same state tensors are updated, so checkpoints do not depend on which of the two ran."""
    for group in optim.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        states = [optim.state[p] for p in params]
        adam(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            foreach=True,
            capturable=torch.compiler.is_compiling(),  # eager (a test) on a CPU refuses capturable
            decoupled_weight_decay=isinstance(optim, torch.optim.AdamW),
            amsgrad=False,
            beta1=group["betas"][0],
            beta2=group["betas"][1],
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )


def step_optimizer(optim: torch.optim.Optimizer) -> None:
    """`optim.step()`, or its traceable form inside a compiled step."""
    if torch.compiler.is_compiling():
        traced_step(optim)
    else:
        optim.step()


@dataclass(frozen=True)
class Sizes:
    """What a learner is built for: the env's observation and per-tick action sizes, the training env count
    and the device its tensors live on."""

    obs_dim: int
    """Observation columns the critics read."""
    action_dim: int
    """The env's action per tick; a chunk policy outputs several of them."""
    num_envs: int
    """Training envs: per-env exploration and return-scale state are part of a learner's checkpoint."""
    device: torch.device
    policy_obs_dim: int | None = None
    """Leading observation columns the actor reads; None: all of them (the rest are critic-only terms)."""

    @classmethod
    def of(cls, env: VecEnv, num_envs: int) -> Sizes:
        """A learner's sizes for `env`'s spaces, trained on `num_envs` envs."""
        return cls(env.obs_dim, env.action_dim, num_envs, env.device, env.policy_obs_dim)


class ActorCritic(nn.Module):
    prefix_critic: Critic | None
    """dqc: the distilled critic of the policy's prefix of the chunk (None otherwise)."""
    gather: Gather = staticmethod(local)
    """Every rank's rows of a tensor, for statistics the learner keeps itself (data-parallel training)."""
    average_gradients: Callable[[Iterable[nn.Parameter]], None] | None = None
    """Data-parallel training: replaces each gradient by its mean over the ranks before a step."""

    def __init__(self, config: ActorCriticConfig, sizes: Sizes):
        """The actor outputs `policy_dim` numbers, one chunk of `sizes.action_dim` actions per tick."""
        super().__init__()
        obs_dim, action_dim, num_envs, device = sizes.obs_dim, sizes.action_dim, sizes.num_envs, sizes.device
        self.config, self.obs_dim, self.action_dim = config, obs_dim, action_dim
        self.policy_obs_dim = obs_dim if sizes.policy_obs_dim is None else sizes.policy_obs_dim
        if not 0 < self.policy_obs_dim <= obs_dim:
            raise ValueError(f"policy_obs_dim: expected in [1, {obs_dim}], got {self.policy_obs_dim}")
        chunk = config.chunk
        self.policy_dim = action_dim * chunk.policy_length
        self.obs_norm = ObsNormalizer(obs_dim, enabled=config.normalize_obs)
        self.return_scale = ReturnScaler(num_envs, config.gamma, config.v_max, enabled=config.scale_rewards)
        if config.critic_head == "categorical":
            self.head: ScalarHead | CategoricalHead | QuantileHead = CategoricalHead(
                config.num_atoms, config.v_min, config.v_max
            )
        elif config.critic_head == "quantile":
            self.head = QuantileHead(config.num_quantiles, config.drop_top)
        else:
            self.head = ScalarHead(config.huber)
        out = self.head.out_features
        if chunk.critic == "multi":
            self.critic: Critic | CausalChunkCritic = CausalChunkCritic(
                obs_dim, action_dim, chunk.size, config.num_critics, out, chunk
            )
        else:
            self.critic = Critic(
                obs_dim,
                action_dim * chunk.size,
                config.critic_hidden,
                config.critic_trunk,
                config.num_critics,
                out,
                config.critic_dropout,
            )
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False) if config.target_network else None
        self.prefix_critic = self.prefix_target = None
        if chunk.critic == "dqc":
            self.prefix_critic = Critic(
                obs_dim, self.policy_dim, config.critic_hidden, config.critic_trunk, config.num_critics, out
            )
            self.prefix_target = copy.deepcopy(self.prefix_critic).requires_grad_(False)
        self.actor = self.build_actor()
        self.actor_average: nn.Module | None = None
        if config.actor_average > 0:
            self.actor_average = copy.deepcopy(self.actor).requires_grad_(False).eval()
        self.matmul_dtype = torch.bfloat16 if config.matmul_dtype == "bfloat16" else None
        """What subclasses building more networks (a cost critic) pass to `set_matmul_dtype`."""
        set_matmul_dtype(self, self.matmul_dtype)
        self.to(device)
        self.device = device
        beta1 = config.adam_beta1
        self.critic_optim = make_optimizer(self.critics().parameters(), config.critic_lr, config.weight_decay, beta1)
        self.actor_optim = make_optimizer(self.actor.parameters(), config.actor_lr, config.weight_decay, beta1)
        self.updates = 0
        self.anchor: Anchor | None = None
        self._compiled: dict[str, Callable] = {}
        if config.compile and device.type == "cpu" and not any(map(shutil.which, ("g++", "c++", "clang++"))):
            raise ValueError("compile: inductor builds CPU kernels with a C++ compiler and none is on PATH")

    # --- pieces an algorithm provides -------------------------------------------------------------
    @abstractmethod
    def build_actor(self) -> nn.Module:
        """The policy network; `actor(normalized_obs)` must return the deterministic action in [-1, 1]."""

    @abstractmethod
    def explore(self, obs: torch.Tensor) -> torch.Tensor:
        """Exploratory actions for collection, from normalized observations."""

    @abstractmethod
    def target_action(self, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bootstrap action a' at s' and the bonus added to the target value (e.g. -alpha log pi)."""

    @abstractmethod
    def actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Actor (and any auxiliary, e.g. temperature) loss on normalized observations."""

    def after_actor_step(self) -> None:
        """Hook after the actor optimizer step (e.g. SAC's temperature update)."""

    def on_step(self, result: StepResult) -> None:
        """Called once per env step with its result (episode-based exploration state)."""

    def metrics(self) -> dict[str, torch.Tensor]:
        """Learner statistics for the log that are not per-update losses (a multiplier, exploration
        counts), read out with the update metrics once per logging window."""
        return {}

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        del state

    # --- shared machinery -----------------------------------------------------------------------------
    @property
    def backup_steps(self) -> int:
        """Rewards each TD target sums: the chunk's length, or `n_step` for a per-step learner."""
        return self.config.chunk.size if self.config.chunk.size > 1 else self.config.n_step

    def critics(self) -> nn.ModuleList:
        """Every network the critic optimizer trains."""
        return nn.ModuleList([self.critic, *([self.prefix_critic] if self.prefix_critic is not None else [])])

    @property
    def policy(self) -> nn.Module:
        """The network deterministic actions and the exported bundle come from: the averaged actor where
        there is one (`actor_average`), else the actor."""
        return self.actor if self.actor_average is None else self.actor_average

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False, averaged: bool = True) -> torch.Tensor:
        """Actions in [-1, 1] for raw observations: exploratory ones from the actor, deterministic ones
        from `policy` (the online actor's with `averaged=False`). The network runs in eval mode, so
        BatchNorm layers use their running statistics rather than those of whatever batch of envs is
        acting."""
        network = self.policy if deterministic and averaged else self.actor
        training = network.training
        network.eval()
        normalized = self.obs_norm(obs)
        action = network(normalized) if deterministic else self.explore(normalized)
        network.train(training)
        return action

    def observe(self, result: StepResult) -> None:
        """Update running statistics from what the envs returned."""
        self.obs_norm.update(result.next_obs)
        self.return_scale.update(result.reward, result.done)
        self.on_step(result)

    def backward(self, loss: torch.Tensor, parameters: list[nn.Parameter]) -> None:
        """Gradients of `loss` for `parameters` alone (those of the networks it also runs through, such
        as the critics in the actor's loss, are neither computed nor stored), averaged over the ranks in
        data-parallel training."""
        for p in parameters:
            p.grad = None
        loss.backward(inputs=parameters)
        if self.average_gradients is not None:
            self.average_gradients(parameters)

    def _step(self, optim: torch.optim.Optimizer, loss: torch.Tensor, module: nn.Module) -> None:
        params = list(module.parameters())
        self.backward(loss, params)
        if self.config.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        step_optimizer(optim)
        if self.config.project_weights:
            project_weights(module)

    def _run(self, step: Callable[..., T], *args) -> T:
        """`step(*args)`, compiled into one graph with `compile` (see `ActorCriticConfig.compile`)."""
        if not self.config.compile:
            return step(*args)
        compiled = self._compiled.get(step.__name__)
        if compiled is None:
            compiled = self._compiled[step.__name__] = torch.compile(step, dynamic=False, options=COMPILE_OPTIONS)
        # Traces loss.backward() into the graph rather than ending the graph there.
        with torch._dynamo.config.patch(trace_autograd_ops=True):  # pyright: ignore[reportPrivateImportUsage]
            return compiled(*args)

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One critic step, an actor step every `policy_delay` updates, then Polyak averaging."""
        metrics = self.critic_update(batch)
        if self.actor_due():
            metrics.update(self.actor_update(batch.obs))
        return metrics

    def actor_due(self) -> bool:
        """Whether the critic update just taken is followed by an actor update (`policy_delay`)."""
        return (self.updates - 1) % self.config.policy_delay == 0

    def critic_update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One critic step on `batch` (raw observations) and the target networks' Polyak step."""
        self.updates += 1
        metrics, td_abs = self._run(self.critic_step, batch)
        self.last_td_abs = td_abs  # each sample's |TD error| (scaled-reward units), for prioritized samplers
        return metrics

    def critic_step(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """What `critic_update` runs (compiled with `compile`): its metrics and each sample's |TD error|."""
        cfg = self.config
        kind = cfg.chunk.critic
        loss = ActorCritic.td_loss if kind == "qc" else multi_horizon_loss if kind == "multi" else decoupled_loss
        critic_loss, td_abs = loss(self, batch)
        self._step(self.critic_optim, critic_loss, self.critics())
        if self.critic_target is not None:
            polyak(self.critic_target, self.critic, cfg.tau)
        if self.prefix_critic is not None and self.prefix_target is not None:
            polyak(self.prefix_target, self.prefix_critic, cfg.tau)
        return {"critic_loss": critic_loss.detach()}, td_abs

    def td_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The one-target TD loss of the head (a per-step, n-step or QC chunk backup) and each sample's
        |TD error|."""
        cfg = self.config
        obs, next_obs = self.obs_norm(batch.obs), self.obs_norm(batch.next_obs)
        reward = batch.reward / self.return_scale.scale()
        with torch.no_grad():
            next_action, bonus = self.target_action(next_obs)
        if cfg.cross_batch:
            n = obs.shape[0]
            both_obs, both_actions = torch.cat([obs, next_obs]), torch.cat([batch.action, next_action])
            both = self.critic(both_obs, both_actions)
            out = both[:, :n]
            if self.critic_target is None:
                target_out = both[:, n:].detach()
            else:
                with torch.no_grad():
                    target_out = self.critic_target(both_obs, both_actions)[:, n:]
        else:
            assert self.critic_target is not None, "target_network=false needs cross_batch"
            with torch.no_grad():
                target_out = self.critic_target(next_obs, next_action)
            out = self.critic(obs, batch.action)
        if cfg.target_subset:
            members = torch.randperm(target_out.shape[0], device=target_out.device)[: cfg.target_subset]
            target_out = target_out[members]
        return self.head.loss(out, target_out, reward, batch.discount, bonus, batch.weight)

    def actor_update(self, raw_obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """One actor step (and its hook, e.g. the temperature) against the current critic."""
        return self._run(self.actor_step, raw_obs)

    def actor_step(self, raw_obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """What `actor_update` runs (compiled with `compile`)."""
        obs = self.obs_norm(raw_obs)
        actor_loss, extra = self.actor_loss(obs)
        if self.anchor is not None:
            penalty, distance = self.anchor.penalty(self.deterministic(obs), raw_obs)
            actor_loss = actor_loss + penalty
            extra = extra | {"anchor_distance": distance}
        self._step(self.actor_optim, actor_loss, self.actor)
        if self.actor_average is not None:
            average_weights(self.actor_average, self.actor, self.config.actor_average)
        self.after_actor_step()
        return {"actor_loss": actor_loss.detach(), **extra}

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's deterministic action as it acts (eval mode: batch-norm layers use, and do not
        update, their running statistics), with gradients, on normalized observations."""
        training = self.actor.training
        self.actor.eval()
        action = self.actor(obs)
        self.actor.train(training)
        return action

    def q_values(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q_i(s, a) of every critic member, (E, B), on normalized observations, for the policy's output
        `action`: per step, its chunk (qc), the prefix the robot executes (multi) or the distilled
        prefix critic (dqc)."""
        if self.prefix_critic is not None:
            return self.head.q(self.prefix_critic(obs, action))
        if self.config.chunk.critic == "multi":
            executed = self.config.chunk.spec().execute * self.action_dim
            return self.head.q(self.critic(obs, action[:, :executed])[:, :, -1])
        return self.head.q(self.critic(obs, action))

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optim, "critic": self.critic_optim}
