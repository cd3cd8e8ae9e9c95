"""Batched MuJoCo simulation: one env API, native-MuJoCo and MJX backends, tasks written once in torch."""

import os
from importlib import metadata


# XLA's CPU fusion emitters duplicate work along MJX's per-depth body-tree passes, so kinematics cost
# grows about exponentially with the depth of the kinematic chain (measured: 0.7 ms for a 3-link chain,
# 37 ms for 7 links, 136 ms per step for the Panda; 0.8 ms for 7 links without them). Set here, when
# q2real.sim is first imported, so it precedes every JAX computation q2real starts (the MJX backend,
# the Playground adapter); XLA reads it when its CPU backend starts, and GPUs ignore it. jaxlib 0.11
# dropped the flag and aborts the process on flags it does not know, so it goes only to older ones.
def _jaxlib_knows_fusion_emitters_flag() -> bool:
    try:
        major, minor = (int(part) for part in metadata.version("jaxlib").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) < (0, 11)


if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", "") and _jaxlib_knows_fusion_emitters_flag():
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_use_fusion_emitters=false").strip()
# On a GPU, XLA takes 75 % of the card's memory at its first call unless told otherwise, and torch
# (replay, networks, the update's activations) shares that card with MJX: XLA allocates as it goes.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from q2real.sim.config import EnvConfig  # noqa: E402
from q2real.sim.randomization import RandomizationConfig  # noqa: E402
from q2real.sim.registry import default_config, make, task_names  # noqa: E402
from q2real.sim.vec_env import StepResult, VecEnv  # noqa: E402

__all__ = ["EnvConfig", "RandomizationConfig", "StepResult", "VecEnv", "default_config", "make", "task_names"]
