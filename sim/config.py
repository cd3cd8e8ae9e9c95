"""Which env to build and how: the `env` section of every q2real config."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from q2real.configs.loader import ConfigError
from q2real.sim.randomization import RandomizationConfig


@dataclass
class EnvConfig:
    task: str = "cartpole_swingup"
    """A registered task (`q2real envs`), or an adapter's env: `gymnasium:<id>`, `playground:<name>` or
    `robosuite:<name>`."""
    num_envs: int = 64
    """Environments stepped in parallel."""
    backend: Literal["auto", "mujoco", "mjx"] = "auto"
    """Physics backend; `auto` picks MJX when a GPU is present and native MuJoCo otherwise."""
    device: str = "auto"
    """Torch device for observations, actions and rewards; `auto` picks CUDA when present."""
    seed: int = 0
    """Seeds the env's random draws: initial states and randomized physics. Training seeds torch with it
    too, and evaluation envs use seed + 10000."""
    task_params: dict[str, Any] = field(default_factory=dict)
    """Task settings (see `q2real envs --task NAME`), or keyword arguments for an adapter's env."""
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    """Domain randomization, drawn once per env: physics, sensor noise, latency, pushes, payload."""
    shield_in_loop: bool | None = None
    """Pass every action through the shield's deterministic clamps (`q2real.sim.shield_clamps`: clip,
    soft limits, the rate limit on the previous target, effort feasibility) at their defaults, so the
    policy learns under the rules the robot's shield will apply. None: on for q2real tasks that deploy
    behind the shield, off for the benchmark tasks that cannot (the velocity-constrained runners) and for
    adapters; true on an adapter is an error."""
    shield_penalty: float = 0.0
    """With the clamps in the loop, subtract this times how far they moved the action (mean over joints
    of |wanted - sent|, in action units) from every step's reward: the shield's intervention charged, so
    the policy learns to stay inside the rules rather than lean on them (under the clamps alone it drives
    into the rate and effort limits, which its return does not see). Linear, so a small overstep still
    costs: a squared charge vanishes near the rate window, where SAC's exploration noise lives. 0: the
    clamps only shape the dynamics."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"env.device: '{name}' requested but this torch build sees no CUDA device")
    return device


def resolve_backend(name: str) -> Literal["mujoco", "mjx"]:
    """`auto` means MJX only where it is fast: a GPU visible to JAX."""
    if name != "auto":
        return name  # type: ignore[return-value]
    if not torch.cuda.is_available():
        return "mujoco"
    try:
        import jax
        from mujoco import mjx  # noqa: F401
    except ImportError:
        return "mujoco"
    return "mjx" if jax.default_backend() == "gpu" else "mujoco"


def stepped_actions(config: EnvConfig) -> bool:
    """Whether the env's actions are steps from the previous action (`action_rate`), not targets."""
    return config.task_params.get("action_rate") is not None


def target_actions(config: EnvConfig) -> EnvConfig:
    """The env a policy bundle acts on: a bundle's graph already turns a step into a target, so the env
    takes targets."""
    if not stepped_actions(config):
        return config
    return dataclasses.replace(config, task_params={**config.task_params, "action_rate": None})


def refuse_stepped_actions(config: EnvConfig, what: str) -> None:
    if stepped_actions(config):
        raise ConfigError(f"env.task_params.action_rate: {what} acts on targets, not steps; leave action_rate unset")
