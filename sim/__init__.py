"""Batched MuJoCo simulation: one env API, native-MuJoCo and MJX backends, tasks written once in torch."""

from q2real.sim.config import EnvConfig
from q2real.sim.randomization import RandomizationConfig
from q2real.sim.registry import default_config, make, task_names
from q2real.sim.vec_env import StepResult, VecEnv

__all__ = ["EnvConfig", "RandomizationConfig", "StepResult", "VecEnv", "default_config", "make", "task_names"]
