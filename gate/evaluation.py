"""Evaluate a training run from its directory alone, with its torch checkpoint or an exported bundle."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import torch
import yaml

from q2real.agents.callbacks import ChunkExecutor, Watch, deterministic_policy, evaluate
from q2real.agents.common.checkpoint import CHECKPOINT
from q2real.agents.config import load_run_config
from q2real.agents.learners import restore_agent
from q2real.configs.errors import RunDirError
from q2real.configs.loader import ConfigError, load
from q2real.sim import EnvConfig, make
from q2real.sim.config import target_actions


def evaluate_run(
    run_dir: str | Path,
    episodes: int = 20,
    seed: int = 12345,
    bundle: str | Path | None = None,
    watch: Watch | None = None,
) -> torch.Tensor:
    """Returns of `episodes` deterministic episodes (one per env). With `bundle`, the exported ONNX policy
    acts (through onnxruntime) instead of the torch checkpoint, on the very same seeded episodes. BC and
    residual runs are judged through their bundle (exported to a temporary file when none is given):
    their policy is more than one agent's actor. `watch` sees every step (a film)."""
    run_dir = Path(run_dir)
    if episodes < 1:
        raise ConfigError(f"--episodes: expected >= 1, got {episodes}")
    kind = run_kind(run_dir)
    if kind != "rl":
        env_config = run_env_config(run_dir, kind)
        if bundle is not None:
            return evaluate_bundle(env_config, Path(bundle), episodes, seed, watch)
        with tempfile.TemporaryDirectory() as tmp:
            exported = export_for_run(run_dir, Path(tmp) / "policy.onnx")
            return evaluate_bundle(env_config, exported, episodes, seed, watch)
    config = load_run_config(run_dir, *(() if bundle is not None else (CHECKPOINT,)))
    if bundle is not None:
        return evaluate_bundle(config.env, Path(bundle), episodes, seed, watch)
    env = make(dataclasses.replace(config.env, num_envs=episodes, seed=seed))
    try:
        agent, _ = restore_agent(run_dir, config, env)
        return evaluate(deterministic_policy(agent, env), env, seed, watch).cpu()
    finally:
        env.close()


def run_kind(run_dir: Path) -> str:
    """`bc`, `residual` (residual RL or RL from demonstrations) or `rl`, from the run's config.yaml."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise RunDirError(f"{run_dir}: not a training run directory (no config.yaml)")
    data = yaml.safe_load(path.read_text())
    if isinstance(data, dict) and data.get("algo") == "bc":
        return "bc"
    return "residual" if isinstance(data, dict) and "residual" in data else "rl"


def run_env_config(run_dir: Path, kind: str | None = None) -> EnvConfig:
    """The env a run of any kind trained on (`kind` as `run_kind` says, read from the run if None)."""
    from q2real.residual.bc import BCConfig
    from q2real.residual.train import ResidualTrainConfig

    kind = kind or run_kind(run_dir)
    if kind == "rl":
        return load_run_config(run_dir).env
    return load(BCConfig if kind == "bc" else ResidualTrainConfig, str(run_dir / "config.yaml")).env


def export_for_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """The run's policy as a bundle (`<run_dir>/policy.onnx` by default), whatever kind of run it is:
    an off-policy learner's actor, a BC policy, or a residual with its base."""
    kind = run_kind(Path(run_dir))
    if kind == "bc":
        from q2real.residual.bc import export_bc as export
    elif kind == "residual":
        from q2real.residual.export import export_residual as export
    else:
        from q2real.agents.export import export_run as export
    return export(run_dir, output)


def evaluate_bundle(
    env_config: EnvConfig, bundle: Path, episodes: int, seed: int, watch: Watch | None = None
) -> torch.Tensor:
    """Returns of `episodes` deterministic episodes of `bundle` (through onnxruntime, as the robot runs
    it) on the env of `env_config`, one per env."""
    from q2real.deploy_ros.bundle import PolicyBundle

    runner = PolicyBundle(bundle)
    env = make(dataclasses.replace(target_actions(env_config), num_envs=episodes, seed=seed))
    try:

        def predict(obs: torch.Tensor) -> torch.Tensor:
            commands = runner(obs[:, : env.policy_obs_dim].cpu().numpy())
            return torch.from_numpy(runner.normalized(commands)).to(env.device)

        chunk = runner.info.chunk
        policy = ChunkExecutor(predict, chunk, env) if chunk.size > 1 else predict
        return evaluate(policy, env, seed, watch).cpu()
    finally:
        env.close()
