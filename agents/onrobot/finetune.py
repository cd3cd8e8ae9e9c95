"""Fine-tuning a trained run on the robot's own stream: the handoff from batch training to the robot.

The learner that trained the run continues, through the one training loop, on one env (the robot)
whose dynamics may differ from training (`shift`): its actor, critic ensemble, target critic,
temperature, observation statistics and optimizer moments all carry over from the run's checkpoint,
so nothing is relearned at the handoff. Three things change, each because a robot is not a
simulator batch: the robot never acts at random (warm-up transitions come from the policy handed
over, with its own exploration), the actor holds still until `actor_start` (the critic first fits the
robot's dynamics under the policy it was handed; an actor that follows a critic still valued for the
training dynamics is what drops the return below the handoff level), and the replay is a bounded
store of robot transitions only. Per-env state of the batch run (the running return of each
training env, exploration-noise repeats) starts fresh, for the one robot.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import yaml

from q2real.agents.callbacks import Callback
from q2real.agents.common.actor_critic import ActorCritic
from q2real.agents.common.anchor import Anchor
from q2real.agents.common.checkpoint import CHECKPOINT
from q2real.agents.common.run_dir import LogConfig, write_atomic
from q2real.agents.config import TrainConfig, load_run_config
from q2real.agents.jobs import job_kind
from q2real.agents.learners import load_learner
from q2real.agents.registry import LEARNERS
from q2real.agents.train import Trainer
from q2real.configs.loader import ConfigError, load, to_dict
from q2real.sim.randomization import RandomizationConfig

FINETUNE_CONFIG = "finetune.yaml"


@dataclass
class FinetuneConfig:
    run: str = ""
    """The trained run directory (config.yaml and checkpoint.pt) whose learner continues."""
    shift: RandomizationConfig = field(default_factory=RandomizationConfig)
    """Dynamics of the robot fine-tuned on, as randomization ranges; equal bounds are a fixed shift
    (`shift.actuator_gain_scale=[0.5,0.5]`: a weaker actuator). Default: the training dynamics."""
    total_steps: int = 10_000
    """Robot transitions (control ticks) to fine-tune for."""
    warmup_steps: int = 1_000
    """Transitions collected under the handed-over policy before the critic learns."""
    actor_start: int = 3_000
    """Transitions before the actor moves; until then only the critic learns."""
    replay_capacity: int = 100_000
    """Robot transitions kept (oldest dropped first)."""
    anchor: float = 0.0
    """Weight of the trust region around the handed-over policy (on the robot: the last version it
    judged good): the actor loss pays this times the squared distance of its actions from that policy's
    (`q2real.agents.common.anchor`), so a candidate stays where the robot's data are. 0: a free actor
    (beside the node the default is 20: `q2real.agents.onrobot.robot_learner.ON_ROBOT`)."""
    updates_per_step: float = 1.0
    """Gradient updates per robot transition once learning starts (may be fractional)."""
    eval_every: int = 1_000
    """Transitions between evaluations of the deterministic policy on the shifted dynamics (a sim robot's twin)."""
    eval_envs: int = 16
    """Evaluation episodes on the shifted dynamics, run in parallel, one per env."""
    checkpoint_every: int = 2_500
    """Transitions between checkpoints, the points `--resume` continues from (0 = only at the end)."""
    threads: int = 1
    """torch CPU threads of the learner: one, so it does not slow a control loop beside it."""
    compile: bool = False
    """Compiled learner steps (the learner's `compile`), whatever the run trained with: off by default,
    because the first update then waits tens of seconds and a robot computer may have no C++ compiler."""
    seed: int = 1
    """Seed of the fine-tuning env (its randomized dynamics and initial states); evaluation uses seed + 10000."""
    reward: Literal["task", "topic"] = "task"
    """On the robot (`q2real deploy --finetune`): `task`, the task's own reward computed from what the
    node streams (tasks with `Task.robot_reward`); `topic`, the values arriving on the node's reward
    input (`~/reward`), for rewards the node cannot compute. Simulation uses the task's."""
    log: LogConfig = field(default_factory=lambda: LogConfig(interval_steps=1_000))
    """Where the fine-tuning run directory goes (named `<run>-finetune-<time>` unless `log.name` is set)."""

    def validate(self) -> None:
        if not self.run:
            raise ConfigError("run: expected the trained run directory to fine-tune")
        if not (self.anchor >= 0 and math.isfinite(self.anchor)):
            raise ConfigError(f"anchor: expected a finite weight >= 0, got {self.anchor}")
        if self.actor_start < self.warmup_steps:
            raise ConfigError(f"actor_start: expected >= warmup_steps ({self.warmup_steps}), got {self.actor_start}")
        self.shift.validate("shift")


def handoff_config(config: FinetuneConfig, run: TrainConfig) -> TrainConfig:
    """The run's training config, turned into the fine-tuning job: one env with the shifted dynamics."""
    if run.pql.enabled:
        raise ConfigError(f"run {config.run}: pql.enabled: fine-tuning continues a single-process learner")
    log = config.log
    if not log.name:
        log = dataclasses.replace(log, name=f"{Path(config.run).name}-finetune-{time.strftime('%Y%m%d-%H%M%S')}")
    return dataclasses.replace(
        run,
        env=dataclasses.replace(run.env, num_envs=1, randomization=config.shift, seed=config.seed),
        log=log,
        randomization_ramp_steps=0,  # the shift is the robot as it is, not a curriculum to grow
        total_steps=config.total_steps,
        warmup_steps=config.warmup_steps,
        updates_per_step=config.updates_per_step,
        replay_capacity=config.replay_capacity,
        eval_every=config.eval_every,
        eval_envs=config.eval_envs,
        checkpoint_every=config.checkpoint_every,
        stop_return=None,
        threads=config.threads,
        agent=dataclasses.replace(run.agent, compile=config.compile),
        init_from=None,  # the job starts from the run itself (`build_agent`), not from where the run began
    )


class HandoffEval(Callback):
    """Evaluates the handed-over policy before the first transition, so the curve starts at the handoff level."""

    def on_start(self, trainer: Trainer) -> None:
        if trainer.step == 0:
            trainer.logger.log(0, {"eval_return": trainer.evaluate(), "eval_cost": trainer.last_eval_cost or 0.0})


class Finetuner(Trainer):
    on_robot = False
    """Transitions come from a robot (the reward input exists there), not from the shifted simulator."""

    def __init__(self, config: FinetuneConfig, resume: Path | None = None):
        config.validate()
        if config.reward == "topic" and not self.on_robot:
            raise ConfigError("reward: 'topic' is the deploy node's reward input; in simulation use 'task'")
        self.finetune = config
        self.source = Path(config.run)
        if (self.source / "config.yaml").is_file() and (kind := job_kind(str(self.source / "config.yaml"), [])) != "rl":
            raise ConfigError(
                f"run: {config.run} is a {kind} run; fine-tuning continues an off-policy RL run ({', '.join(LEARNERS)})"
            )
        self.run_config = load_run_config(self.source, CHECKPOINT)
        super().__init__(handoff_config(config, self.run_config), [HandoffEval()], resume=resume)
        write_atomic(self.path / FINETUNE_CONFIG, yaml.safe_dump(to_dict(config), sort_keys=False))
        self.run_dir.update_meta(finetuned_from=str(self.source.resolve()))

    def build_agent(self) -> ActorCritic:
        """The run's learner as its checkpoint left it, for one env."""
        agent = super().build_agent()
        state = load_learner(agent, self.source, self.config)
        for name, optimizer in agent.optimizers().items():
            optimizer.load_state_dict(state["optimizers"][name])
        agent.updates = int(state["updates"])
        if self.finetune.anchor > 0:
            agent.anchor = Anchor(agent.policy, agent.obs_norm, self.finetune.anchor)
        return agent

    def warmup_action(self) -> torch.Tensor:
        return self.policy_action()

    def actor_trains(self) -> bool:
        """The actor waits for `finetune.actor_start` steps: first the critic learns the new robot."""
        return self.step >= self.finetune.actor_start


def load_finetune_config(run_dir: Path) -> FinetuneConfig:
    """The fine-tuning job a fine-tuning run directory was started with (for `--resume`)."""
    path = run_dir / FINETUNE_CONFIG
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a fine-tuning run directory (no {FINETUNE_CONFIG})")
    return load(FinetuneConfig, str(path))
