"""The training job's config: the env, the learner (one section, the one `algo` names), the schedule."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from q2real.agents.algos.sac_lag import SACLagConfig
from q2real.agents.common.actor_critic import ActorCriticConfig
from q2real.agents.common.run_dir import LogConfig
from q2real.agents.common.samplers import SamplerConfig
from q2real.agents.pql import PQLConfig
from q2real.agents.registry import LEARNER_SETTINGS, LEARNERS
from q2real.configs.errors import RunDirError
from q2real.configs.loader import load, section
from q2real.sim import EnvConfig

LEGACY_SECTIONS = ("sac", "td3", "ddpg", "flashsac")
"""The learners of the time when a run directory's config carried every learner's section: an old one
holds exactly these, whatever learners were registered since."""


@dataclass
class TrainConfig:
    env: EnvConfig = field(default_factory=lambda: EnvConfig(task="pendulum_swingup", num_envs=4))
    """The task trained on and its envs; evaluation runs `eval_envs` more of them, seeded apart."""
    log: LogConfig = field(default_factory=lambda: LogConfig(interval_steps=5_000))
    """Where the run directory goes and how metrics are logged."""
    algo: str = "sac"
    """Which learner (a name of `q2real.agents.registry.LEARNERS`); its settings are the section of the same
    name (`sac:`, `td3:`, ...)."""
    agent: ActorCriticConfig = section("algo", LEARNER_SETTINGS, "sac")
    """The learner's settings, written under the algo's name; switching `algo` starts from its defaults."""
    total_steps: int = 50_000
    """Env steps summed over all envs."""
    warmup_steps: int = 2_000
    """Env steps of uniform random actions before learning starts."""
    updates_per_step: float = 1.0
    """Gradient updates per vectorized env step (may be fractional)."""
    replay_capacity: int = 1_000_000
    """Transitions kept, over all envs."""
    eval_every: int = 5_000
    """Env steps between deterministic evaluations (0 = only at the end)."""
    eval_envs: int = 10
    """Evaluation episodes, run in parallel, one per env, on envs seeded apart from training."""
    checkpoint_every: int = 10_000
    """Env steps between checkpoints, the points `--resume` continues from (0 = only at the end; Ctrl-C
    writes one too)."""
    checkpoint_replay: bool = True
    """Keep the replay's rows in use in each checkpoint, so a resume continues bit-for-bit. False: the
    checkpoint holds networks, optimizers and counters only (megabytes, not the replay's size); a
    resume then refills the replay with the policy and pauses updates until it holds a batch."""
    stop_return: float | None = None
    """Stop early once the evaluation mean return reaches this."""
    init_from: str | None = None
    """A run directory whose learner (networks, normalizer statistics, temperature) this run starts from,
    warming up with its policy; replay, optimizers and counters start afresh. A curriculum step: a policy
    that walks, trained on under effects it never met. Algo, task, network shapes and action sizes must
    match, and the observation, but for policy terms appended after the source's and critic-only terms
    appended after its critic-only ones (their input weights start at zero); the env count may differ."""
    randomization_ramp_steps: int = 0
    """A curriculum: env steps over which the training envs' `env.randomization` grows from the nominal
    robot to its full ranges, in 100 equal steps. Each env keeps its own drawn robot, moved toward nominal
    (masses, gains, friction, damping, CoM, payload, sensor noise and bias, push sizes; latency rounded to
    ticks), so a policy that walks on the nominal robot meets the effects a little at a time rather than all
    at once. Evaluation is always under the full ranges. 0: full ranges from the first step."""
    threads: int = 0
    """torch CPU threads: 0 = auto (on a CPU training device, tuned online between all cores and one, so a
    busy neighbour process cannot stall every update; recorded in meta.json), N = fixed (needed for
    bit-exact reruns and resumes of learners with batch statistics, e.g. FlashSAC)."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """Replay sampling: uniform, prioritized (PER) or dspear (D-SPEAR's dual-stream prioritized replay)."""
    pql: PQLConfig = field(default_factory=PQLConfig)
    """Parallel Q-Learning: critic and policy learners in their own processes, concurrent with collection."""

    @classmethod
    def upgrade(cls, data: Mapping[str, Any], source: str) -> Mapping[str, Any]:
        """Run directories written before a config held one learner section carry every learner's
        section; only the chosen algo's ever took effect, so the others are dropped."""
        if not all(name in data for name in LEGACY_SECTIONS):
            return data
        algo = data.get("algo", "sac")
        return {k: v for k, v in data.items() if k not in LEARNERS or k == algo}

    def validate(self) -> None:
        for key in ("total_steps", "eval_envs"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: expected >= 1, got {getattr(self, key)}")
        for key in ("warmup_steps", "eval_every", "checkpoint_every", "threads", "randomization_ramp_steps"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}: expected >= 0, got {getattr(self, key)}")
        if not 0 < self.updates_per_step < math.inf:
            raise ValueError(f"updates_per_step: expected > 0 and finite, got {self.updates_per_step}")
        if self.replay_capacity < max(1, self.env.num_envs):
            raise ValueError(
                f"replay_capacity: expected >= env.num_envs ({self.env.num_envs}) so one vectorized step fits, "
                f"got {self.replay_capacity}"
            )
        if self.randomization_ramp_steps and self.randomization_ramp_steps > self.total_steps:
            raise ValueError(
                f"randomization_ramp_steps: expected <= total_steps ({self.total_steps}) so training reaches the "
                f"full ranges, got {self.randomization_ramp_steps}"
            )
        if self.stop_return is not None and math.isnan(self.stop_return):
            raise ValueError("stop_return: expected a number or null, got nan")
        if self.algo not in LEARNERS:
            raise ValueError(f"algo: expected one of {list(LEARNERS)}, got {self.algo!r}")
        if type(self.agent) is not LEARNERS[self.algo].config:
            expected = LEARNERS[self.algo].config.__name__
            raise ValueError(f"{self.algo}: expected {expected} settings for algo={self.algo}")
        self.log.validate()
        self.agent.validate(self.algo)
        self.pql.validate()
        self.sampler.validate()
        if self.pql.enabled and isinstance(self.agent, SACLagConfig):
            raise ValueError(f"pql.enabled: {self.algo} keeps its multiplier and cost critic in one process; use false")
        if self.pql.enabled and self.agent.compile:
            raise ValueError(f"{self.algo}.compile: PQL's learner processes run eager steps; use false")
        if self.pql.enabled and self.sampler.kind != "uniform":
            raise ValueError("sampler.kind: PQL learners sample uniformly; prioritized replay needs pql.enabled=false")
        if self.sampler.kind == "dspear" and self.sampler.critic_stream and self.agent.critic_head != "scalar":
            raise ValueError(f"sampler.kind=dspear: its Huber critic loss needs {self.algo}.critic_head=scalar")


def load_run_config(run_dir: Path, *needs: str) -> TrainConfig:
    """The resolved config of a training run directory, which must hold config.yaml and the files `needs`."""
    for name in ("config.yaml", *needs):
        if not (run_dir / name).is_file():
            raise RunDirError(f"{run_dir}: not a training run directory (no {name})")
    return load(TrainConfig, str(run_dir / "config.yaml"))
