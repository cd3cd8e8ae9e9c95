"""Behaviour cloning: the base policy residual RL starts from, and a policy bundle on its own.

An MLP regresses the demonstrated actions (or the next `chunk` of them, executed through the same
chunk queue as the robot's) from observations normalized with the training split's statistics,
by mean squared error in the env's [-1, 1] action space. Episodes, not frames, are split into
training and validation sets, so validation frames never neighbour training frames; training stops
when the validation loss has not improved for `patience` epochs and keeps the best epoch's weights.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from q2real.agents.callbacks import ChunkExecutor, evaluate_episodes
from q2real.agents.common.checkpoint import CHECKPOINT, check_config, load_checkpoint, save_checkpoint
from q2real.agents.common.metrics import MetricLogger, Panel
from q2real.agents.common.networks import DeterministicActor
from q2real.agents.common.normalizer import ObsNormalizer
from q2real.agents.common.progress import Progress
from q2real.agents.common.run_dir import LogConfig, RunDir
from q2real.agents.export import CommandGraph, bundle_metadata, write_graph
from q2real.agents.jobs import job_kind
from q2real.configs.errors import RunDirError
from q2real.configs.loader import ConfigError, load, to_dict
from q2real.contracts.chunks import ChunkSpec
from q2real.residual.dataset import Demos, read_lerobot
from q2real.sim import EnvConfig, VecEnv, make
from q2real.sim.config import refuse_stepped_actions


@dataclass
class BCConfig:
    algo: Literal["bc"] = "bc"
    """Behaviour cloning; `algo=bc` is what selects this job in `q2real train`."""
    dataset: str = ""
    """A LeRobotDataset v3 folder (`q2real demos record`, or imported)."""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(task="", num_envs=1))
    """The env to evaluate on and export for; an empty task takes the dataset's task and task_params."""
    log: LogConfig = field(default_factory=LogConfig)
    """Where the run directory goes (named `bc-<task>-<time>` unless `log.name` is set); the losses are
    logged once per epoch."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the cloned policy (an MLP with a tanh output)."""
    chunk: int = 1
    """Actions predicted per query (h); they run open loop unless `execute` is smaller."""
    execute: int = 0
    """Ticks between queries (0: the whole chunk)."""
    ensemble: float | None = None
    """ACT's temporal-ensembling coefficient (needs execute=1), or null."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    batch_size: int = 256
    """Frames per gradient step of the squared-error loss."""
    max_epochs: int = 500
    """Passes over the training episodes at most; `patience` usually stops earlier."""
    patience: int = 30
    """Epochs without a better validation loss before stopping."""
    val_fraction: float = 0.1
    """Share of the episodes held out (at least one when there are two or more)."""
    successful_only: bool = True
    """Clone only the episodes that succeeded (datasets without success flags keep all)."""
    max_episodes: int = 0
    """Use only the first N (kept) episodes; 0 = all. A deliberately weak base is a BC from a few demos."""
    eval_episodes: int = 10
    """Episodes the best epoch's policy is evaluated on at the end, in parallel, seeded as a training
    run's evaluation (env.seed + 10000), so a base and the residual on it meet the same ones; 0: none."""
    seed: int = 0
    """Seeds the network's initialization, the held-out split and the batches' order."""
    threads: int = 1
    """torch CPU threads while training."""

    def spec(self) -> ChunkSpec:
        return ChunkSpec(self.chunk, self.execute or self.chunk, self.ensemble)

    def validate(self) -> None:
        checks = [
            (bool(self.dataset), "dataset", "a LeRobotDataset folder"),
            (len(self.hidden) > 0 and all(w >= 1 for w in self.hidden), "hidden", "one or more widths >= 1"),
            (0 < self.lr < math.inf, "lr", "> 0 and finite"),
            (0 <= self.weight_decay < math.inf, "weight_decay", ">= 0 and finite"),
            (self.batch_size >= 1, "batch_size", ">= 1"),
            (self.max_epochs >= 1, "max_epochs", ">= 1"),
            (self.patience >= 1, "patience", ">= 1"),
            (0 <= self.val_fraction < 1, "val_fraction", "in [0, 1)"),
            (self.max_episodes >= 0, "max_episodes", ">= 0"),
            (self.eval_episodes >= 0, "eval_episodes", ">= 0"),
            (self.threads >= 1, "threads", ">= 1"),
        ]
        for ok, key, expected in checks:
            if not ok:
                raise ConfigError(f"{key}: expected {expected}, got {getattr(self, key)!r}")
        for key, expected in self.spec().problems():
            raise ConfigError(f"{'chunk' if key == 'size' else key}: expected {expected}")


class BCPolicy(nn.Module):
    """raw obs -> normalize -> MLP -> tanh: one action (or a flattened chunk of them) in [-1, 1]."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], chunk: int):
        super().__init__()
        self.obs_dim, self.action_dim, self.chunk = obs_dim, action_dim, chunk
        self.obs_norm = ObsNormalizer(obs_dim)
        self.net = DeterministicActor(obs_dim, action_dim * chunk, hidden, "mlp")

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.obs_norm(obs))


def chunk_targets(demos: Demos, chunk: int) -> np.ndarray:
    """(T, chunk * action_dim): the `chunk` actions taken from each frame on, the episode's last action
    repeated past its end (those ticks never ran)."""
    ends = np.repeat(demos.bounds()[:, 1], np.diff(demos.bounds(), axis=1)[:, 0])
    index = np.minimum(np.arange(len(demos.obs))[:, None] + np.arange(chunk), ends[:, None] - 1)
    return demos.action[index].reshape(len(demos.obs), -1)


def prepare(config: BCConfig) -> tuple[Demos, EnvConfig]:
    """The episodes to clone and the env they run on (the dataset's own unless the config names one)."""
    refuse_stepped_actions(config.env, "behaviour cloning of recorded targets")
    demos = read_lerobot(config.dataset)
    if config.successful_only and demos.success is not None:
        demos = demos.select(np.flatnonzero(demos.episode_success()))
    if config.max_episodes:
        demos = demos.select(np.arange(min(config.max_episodes, demos.num_episodes)))
    if demos.num_episodes == 0:
        raise ConfigError(
            f"dataset: {config.dataset} holds no episodes to clone (successful_only={config.successful_only})"
        )
    env = config.env
    if not env.task:
        if not demos.task:
            raise ConfigError(f"env.task: {config.dataset} does not say which task it was recorded on; set env.task")
        env = dataclasses.replace(env, task=demos.task, task_params=dict(demos.q2real.get("task_params", {})))
    return demos, env


class BCRun:
    """A BC training run: its directory, the policy, and the evaluation env."""

    def __init__(self, config: BCConfig):
        config.validate()
        self.demos, env_config = prepare(config)
        self.config = config = dataclasses.replace(config, env=env_config)
        torch.manual_seed(config.seed)
        # The evaluation episodes of a training run on this env config (`Trainer.eval_env`), so a BC base
        # and the residual on it are judged on the very same episodes.
        eval_env = dataclasses.replace(env_config, num_envs=max(config.eval_episodes, 1), seed=env_config.seed + 10_000)
        self.env = make(eval_env)
        try:
            self.env.require_policy_obs("behaviour cloning")
        except ConfigError:
            self.env.close()
            raise
        if self.demos.obs.shape[1] != self.env.obs_dim or self.demos.action.shape[1] != self.env.action_dim:
            self.env.close()
            raise ConfigError(
                f"dataset: {config.dataset} has observations of {self.demos.obs.shape[1]} and actions of "
                f"{self.demos.action.shape[1]}, env {env_config.task} has {self.env.obs_dim} and {self.env.action_dim}"
            )
        self.policy = BCPolicy(self.env.obs_dim, self.env.action_dim, config.hidden, config.chunk).to(self.env.device)
        self.run_dir = RunDir(config, config.log, f"bc-{env_config.task}")
        self.path = self.run_dir.path
        self.epochs = 0
        self.best_val = math.inf
        self.eval_return: float | None = None
        self.eval_success: float | None = None

    def run(self) -> Path:
        config, demos, device = self.config, self.demos, self.env.device
        threads = torch.get_num_threads()
        torch.set_num_threads(config.threads)
        losses = Panel("behaviour cloning loss", ("bc/train_loss", "bc/val_loss"))
        logger = MetricLogger(
            self.run_dir, config.log, panels=(losses, Panel("return", ("eval_return",))), x_label="epochs"
        )
        try:
            rng = np.random.default_rng(config.seed)
            order = rng.permutation(demos.num_episodes)
            held = int(round(config.val_fraction * demos.num_episodes))
            held = max(held, 1) if config.val_fraction > 0 and demos.num_episodes > 1 else held
            train, val = demos.select(np.sort(order[held:])), demos.select(np.sort(order[:held]))
            obs = torch.as_tensor(train.obs, device=device)
            target = torch.as_tensor(chunk_targets(train, config.chunk), device=device)
            val_obs = torch.as_tensor(val.obs, device=device)
            val_target = torch.as_tensor(chunk_targets(val, config.chunk), device=device) if held else None
            self.policy.obs_norm.update(obs)
            optim = torch.optim.AdamW(self.policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
            best = copy.deepcopy(self.policy.state_dict())
            stale = 0
            progress = Progress(config.max_epochs, "bc", unit="epoch")
            for epoch in range(config.max_epochs):
                perm = torch.randperm(len(obs), device=device)
                total = torch.zeros((), device=device)
                for start in range(0, len(obs), config.batch_size):
                    pick = perm[start : start + config.batch_size]
                    loss = (self.policy(obs[pick]) - target[pick]).pow(2).mean()
                    optim.zero_grad(set_to_none=True)
                    loss.backward()
                    optim.step()
                    total += loss.detach() * len(pick)
                train_loss = float(total) / len(obs)  # one read per epoch
                with torch.no_grad():
                    val_loss = (
                        float((self.policy(val_obs) - val_target).pow(2).mean())
                        if val_target is not None
                        else train_loss
                    )
                if not (math.isfinite(train_loss) and math.isfinite(val_loss)):
                    raise FloatingPointError(
                        f"bc: non-finite loss at epoch {epoch} (train {train_loss}, val {val_loss})"
                    )
                self.epochs = epoch + 1
                logger.log(epoch + 1, {"bc/train_loss": train_loss, "bc/val_loss": val_loss})
                progress.update(1, train=train_loss, val=val_loss)
                if val_loss < self.best_val:
                    self.best_val, stale = val_loss, 0
                    best = copy.deepcopy(self.policy.state_dict())
                else:
                    stale += 1
                    if stale >= config.patience:
                        break
            progress.close()
            self.policy.load_state_dict(best)
            self.policy.eval()
            if config.eval_episodes:
                returns, success = self.evaluate()
                self.eval_return, self.eval_success = float(returns.mean()), success
                logger.log(self.epochs, {"eval_return": self.eval_return, "eval_success": success})
            save_checkpoint(self.path / CHECKPOINT, self.state())
        finally:
            torch.set_num_threads(threads)
            logger.close()
            self.env.close()
        return self.path

    def evaluate(self) -> tuple[torch.Tensor, float]:
        return evaluate_policy(self.policy, self.config, self.env, self.config.env.seed + 10_000)

    def state(self) -> dict[str, Any]:
        return {
            "format": 1,
            "config": to_dict(self.config),
            "spaces": {"obs_dim": self.env.obs_dim, "action_dim": self.env.action_dim},
            "policy": self.policy.state_dict(),
            "epochs": self.epochs,
            "best_val_loss": self.best_val,
            "episodes": self.demos.num_episodes,
            "frames": len(self.demos.obs),
            "eval_return": self.eval_return,
            "eval_success": self.eval_success,
        }


def executed(policy: nn.Module, config: BCConfig, env: VecEnv) -> Callable[[torch.Tensor], torch.Tensor]:
    """`policy` as it acts on `env`, tick by tick: a chunk policy through the robot's chunk queue."""
    spec = config.spec()
    return ChunkExecutor(policy, spec, env) if spec.size > 1 else policy


@torch.no_grad()
def evaluate_policy(policy: nn.Module, config: BCConfig, env: VecEnv, seed: int) -> tuple[torch.Tensor, float]:
    """Returns of one episode per env, and the share of them that ever passed the task's success test."""
    returns, success, _ = evaluate_episodes(executed(policy, config, env), env, seed)
    return returns, float(success.float().mean()) if success is not None else math.nan


def load_bc(run_dir: str | Path, device: torch.device | str = "cpu") -> tuple[BCConfig, BCPolicy, dict[str, Any]]:
    """A BC run's config, its policy in eval mode, and the checkpoint's record (episodes, losses)."""
    run_dir = Path(run_dir)
    for name in ("config.yaml", CHECKPOINT):
        if not (run_dir / name).is_file():
            raise RunDirError(f"{run_dir}: not a BC run directory (no {name})")
    found = job_kind(str(run_dir / "config.yaml"), [])
    if found != "bc":
        names = {"rl": "an off-policy learner's", "stream": "a streaming learner's", "residual": "a residual"}
        raise RunDirError(
            f"{run_dir}: {names[found]} run, and a BC run is needed here (one trained with "
            "`q2real train algo=bc dataset=DEMOS`)"
        )
    config = load(BCConfig, str(run_dir / "config.yaml"))
    state = load_checkpoint(run_dir / CHECKPOINT, device)
    check_config(
        run_dir / CHECKPOINT, state.get("config", {}), to_dict(config), ["algo", "env.task", "hidden", "chunk"]
    )
    spaces = state["spaces"]
    policy = BCPolicy(spaces["obs_dim"], spaces["action_dim"], config.hidden, config.chunk).to(device)
    policy.load_state_dict(state["policy"])
    policy.eval()
    return config, policy, state


def export_bc(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """A BC run's policy as a bundle of its own (`<run_dir>/policy.onnx` by default)."""
    run_dir = Path(run_dir)
    config, policy, state = load_bc(run_dir)
    env = make(dataclasses.replace(config.env, num_envs=1, device="cpu"))
    try:
        graph = CommandGraph(policy, config.chunk, env.action_scale, env.action_offset)
        training = {
            "algo": "bc",
            "dataset": {"path": config.dataset, "episodes": state["episodes"], "frames": state["frames"]},
            "epochs": state["epochs"],
            "config": to_dict(config),
        }
        normalization = {"baked_in": True, "clip": policy.obs_norm.clip}
        meta = bundle_metadata(env, config.env.task, normalization, config.spec(), training)
        return write_graph(graph, meta, Path(output) if output else run_dir / "policy.onnx")
    finally:
        env.close()
