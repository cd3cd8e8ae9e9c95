"""The one off-policy training loop: collect from N envs, store, update, call back.

Every learner (SAC, TD3, DDPG, FlashSAC, and the variants built on them) runs through `Trainer`.
What varies between them lives in the agent (`ActorCritic` pieces), the sampler or callbacks; the
loop owns only ordering: act -> step -> guard -> store -> update -> callbacks. Schedules and
callbacks are in `q2real.agents.callbacks`, the checkpoint's contents in `q2real.agents.training_state`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from q2real.agents.callbacks import (
    Callback,
    CheckpointCallback,
    ChunkExecutor,
    EvalCallback,
    LogCallback,
    StopTraining,
    Watch,
    deterministic_policy,
    evaluate_episodes,
)
from q2real.agents.common.actor_critic import ActorCritic
from q2real.agents.common.checkpoint import CHECKPOINT, CheckpointError, save_checkpoint
from q2real.agents.common.episodes import EpisodeTracker
from q2real.agents.common.guard import FiniteFlags, check_finite, parameters_of
from q2real.agents.common.memory import check_fits
from q2real.agents.common.metrics import RETURNS, MetricLogger, Panel
from q2real.agents.common.replay import ReplayStorage
from q2real.agents.common.run_dir import RunDir
from q2real.agents.common.samplers import UniformSampler, make_sampler
from q2real.agents.common.threads import ThreadTuner
from q2real.agents.config import TrainConfig, load_run_config
from q2real.agents.distributed import PREVIOUS_CHECKPOINT, SEED_STRIDE, DataParallel, Ranks, rank_dir
from q2real.agents.learners import build_agent, load_learner
from q2real.agents.pql import LearnerJob, ParallelLearners
from q2real.agents.training_state import restore, training_state
from q2real.configs.loader import ConfigError
from q2real.sim import EnvConfig, VecEnv, make
from q2real.sim.config import refuse_stepped_actions
from q2real.sim.env import TaskEnv
from q2real.sim.randomization import DRAW_RANGES, RandomizationConfig, summarized

RAMP_LEVELS = 100
"""Steps of `randomization_ramp_steps`: each re-installs every env's model fields, so not every tick."""


class Trainer:
    """Owns the env, agent, replay and counters; `run()` trains to `total_steps` or an early stop."""

    def __init__(self, config: TrainConfig, callbacks: Sequence[Callback] = (), resume: Path | None = None):
        self._check_job(config, resume)
        self.config = config = self._join_ranks(config)
        self._torch_threads = torch.get_num_threads()  # restored after the run: the setting is process-wide
        torch.manual_seed(config.env.seed)
        self._make_envs()
        self._check_envs()
        with self._envs_closed_on_error():
            self.agent = self.build_agent()
        if self.parallel_data is not None:
            self.parallel_data.attach(self.agent)
        self._make_replay()
        self._reset_counters()
        self.obs = self.env.reset(seed=config.env.seed)
        with self._envs_closed_on_error():
            elapsed = self._restore(Path(resume)) if resume is not None else 0.0
        self._open_run_dir(callbacks, resume, elapsed)

    # --- building a trainer, step by step ------------------------------------------------------------
    def _check_job(self, config: TrainConfig, resume: Path | None) -> None:
        """Refuse a job that cannot run before anything is built: its settings, the run it starts from."""
        config.validate()
        self.init_from = Path(config.init_from) if config.init_from is not None and resume is None else None
        """The run whose learner this one starts from; a resume loads its own checkpoint instead."""
        if self.init_from is not None and not (self.init_from / CHECKPOINT).is_file():
            raise ConfigError(f"init_from: {self.init_from} holds no {CHECKPOINT}; expected a training run's directory")
        if config.agent.chunk.size > 1:
            refuse_stepped_actions(config.env, "a chunk policy")

    def _join_ranks(self, config: TrainConfig) -> TrainConfig:
        """Under torchrun, join the data-parallel group and return this rank's config: its own env seeds
        and device. Alone, the config as it is."""
        self.ranks = ranks = Ranks.launched()
        """This process's rank in a torchrun job (None when it trains alone)."""
        self.parallel_data: DataParallel | None = None
        if ranks is None:
            return config
        if config.pql.enabled:
            raise ConfigError(
                "pql.enabled: Parallel Q-Learning cannot run under torchrun: its learner processes step "
                "their own optimizers concurrently with collection, so no all-reduce can keep ranks in "
                "step; train PQL in one process (it already spreads over the cores)"
            )
        env = dataclasses.replace(
            config.env, seed=config.env.seed + ranks.rank * SEED_STRIDE, device=ranks.device(config.env.device)
        )
        self.parallel_data = DataParallel(ranks, torch.device(env.device))
        return dataclasses.replace(config, env=env)

    def _make_envs(self) -> None:
        """The training envs and the evaluation envs, seeded apart; torch's CPU threads are chosen between
        them, once the training device is known."""
        config, ranks = self.config, self.ranks
        self.env = self.make_env(config.env)
        self.envs_per_iteration = self.env.num_envs * (ranks.world if ranks is not None else 1)
        """Env steps one iteration adds to `step`: every rank's envs."""
        self.threads = self._thread_policy()
        self.eval_env = self.make_env(dataclasses.replace(config.env, num_envs=config.eval_envs, seed=self.eval_seed))
        self._ramp_level: int | None = None
        """The training envs' randomization level under `randomization_ramp_steps` (None: not set yet)."""

    def _check_envs(self) -> None:
        """Refuse a learner the task cannot serve: a cost limit without a safety cost, or a replay and
        networks the device cannot hold."""
        config, env = self.config, self.env
        if getattr(config.agent, "cost_limit", None) is not None and not env.has_cost:
            raise ConfigError(
                f"algo: {config.algo} learns under a cost limit, and env.task {config.env.task} defines no safety "
                "cost with these settings (its cost is always 0); choose a task with one (`q2real envs` marks "
                "them, `q2real envs --task NAME` says how to switch it on) or another algo"
            )
        check_fits(config.algo, config.agent, config.replay_capacity, env.obs_dim, env.action_dim, env.device)
        if config.env.task_params.get("critic_dynamics") and not summarized(config.env.randomization):
            raise ConfigError(
                "env.task_params.critic_dynamics: env.randomization draws no robot the critics' columns describe "
                f"({', '.join(DRAW_RANGES)}), so they would see the nominal robot's zeros"
            )
        if config.randomization_ramp_steps:
            if not isinstance(env, TaskEnv) or config.env.randomization == RandomizationConfig():
                raise ConfigError(
                    f"randomization_ramp_steps: grows env.randomization, and env.task {config.env.task} with these "
                    "settings randomizes nothing; set env.randomization's ranges or randomization_ramp_steps=0"
                )

    @contextlib.contextmanager
    def _envs_closed_on_error(self) -> Iterator[None]:
        """Close both envs if the block fails: a trainer that is never returned is never closed."""
        try:
            yield
        except BaseException:
            self.env.close()
            self.eval_env.close()
            raise

    def _make_replay(self) -> None:
        """The replay storage, its sampler, the episode statistics and a chunk policy's executor."""
        config, env = self.config, self.env
        self.replay = ReplayStorage(config.replay_capacity, env.num_envs, env.obs_dim, env.action_dim, env.device)
        self.sampler = self.make_sampler()
        self.episodes = EpisodeTracker(env.num_envs, env.device, env.reward_terms)
        spec = config.agent.chunk.spec()
        self.chunks = ChunkExecutor(self.agent.act, spec, env) if spec.size > 1 else None
        """Executes an exploring chunk policy tick by tick, as its bundle will run (None per step)."""

    def _reset_counters(self) -> None:
        """Steps, owed updates, the metric window and the last evaluation, as at the start of a run."""
        self.step = self.iteration = 0
        self.update_credit = 0.0
        """Fractional updates owed to the next iteration (`updates_per_step` below 1)."""
        self._metric_sums: dict[str, torch.Tensor] = {}
        """Update metrics summed on the device since the last logging window (a NaN propagates into its sum)."""
        self._metric_count = 0
        self.finite = FiniteFlags()
        """The first env step of this window at which an env output or update metric was non-finite."""
        self.last_checkpoint: Path | None = None
        self.learn_from = 0
        """Env step before which no update runs besides warm-up: a resume without replay refills it first."""
        self.last_eval: float | None = None
        self.last_eval_success: float | None = None
        """Share of the last evaluation's episodes that passed the task's success test (None: no test)."""
        self.last_eval_cost: float | None = None
        """Mean summed safety cost of the last evaluation's episodes."""
        self.parallel: ParallelLearners | None = None

    def _open_run_dir(self, callbacks: Sequence[Callback], resume: Path | None, elapsed: float) -> None:
        """The run directory, its metric logger and the callbacks. Every rank's checkpoint is collective, so
        every rank checkpoints; only the leader logs, evaluates and runs the caller's callbacks, and other
        ranks write theirs under its directory (`rank<r>/`)."""
        config, ranks = self.config, self.ranks
        if ranks is None or ranks.leader:
            self.run_dir = RunDir(config, config.log, config.env.task, resume=resume)
            if self.parallel_data is not None:
                self.run_dir.update_meta(ranks=self.parallel_data.ranks.world)
                self.parallel_data.from_leader(str(self.run_dir.path))
            log = config.log
            builtin: list[Callback] = [CheckpointCallback(), LogCallback(), EvalCallback()]
            callbacks = [*builtin, *callbacks]
        else:
            assert self.parallel_data is not None
            leader_path = Path(str(self.parallel_data.from_leader(None)))
            log = dataclasses.replace(config.log, tensorboard=False, wandb="off")
            self.run_dir = RunDir(config, log, config.env.task, resume=leader_path / rank_dir(ranks.rank))
            callbacks = [CheckpointCallback()]
        self.path = self.run_dir.path
        self.run_dir.update_meta(threads=self.thread_summary())
        self.logger = MetricLogger(self.run_dir, log, elapsed=elapsed, panels=self.curve_panels())
        self.callbacks = callbacks

    # --- pieces a training job built on this loop may replace ----------------------------------------
    def make_env(self, env_config: EnvConfig) -> VecEnv:
        """The training env, and (with the evaluation seed and count) the evaluation env."""
        return make(env_config)

    def build_agent(self) -> ActorCritic:
        agent = build_agent(self.config, self.env)
        if self.init_from is not None:
            load_learner(agent, self.init_from, self.config, grown_observation(self.init_from, self.env))
        return agent

    def make_sampler(self) -> UniformSampler:
        return make_sampler(self.config.sampler, self.replay)

    def curve_panels(self) -> tuple[Panel, ...]:
        return curve_panels(self.config)

    def warmup_action(self) -> torch.Tensor:
        """What the envs do before learning starts: uniform random actions, or for a run that starts from
        another (`init_from`) that run's exploring policy, so the first replay holds its skill."""
        if self.config.init_from is not None:  # also after a resume: the run began that way
            return self.policy_action()
        env = self.env
        return torch.rand(env.num_envs, env.action_dim, device=env.device) * 2 - 1

    def policy_action(self) -> torch.Tensor:
        """The agent's exploring action, a chunk policy's through the robot's queue."""
        return self.chunks(self.obs) if self.chunks is not None else self.agent.act(self.obs)

    # --- one iteration -----------------------------------------------------------------------------
    @property
    def randomization_strength(self) -> float | None:
        if not self.config.randomization_ramp_steps or self._ramp_level is None:
            return None
        return self._ramp_level / RAMP_LEVELS

    def ramp_randomization(self) -> None:
        """Under `randomization_ramp_steps`, the training envs' randomization at this step's level."""
        ramp = self.config.randomization_ramp_steps
        level = min(RAMP_LEVELS, self.step * RAMP_LEVELS // ramp)
        if level != self._ramp_level:
            assert isinstance(self.env, TaskEnv)  # checked when the envs were made
            self.env.set_randomization_strength(level / RAMP_LEVELS)
            self._ramp_level = level

    def collect(self) -> None:
        env, agent = self.env, self.agent
        if self.config.randomization_ramp_steps:
            self.ramp_randomization()
        action = self.warmup_action() if self.step < self.config.warmup_steps else self.policy_action()
        result = env.step(action)
        self.finite.record({"env output next_obs": result.next_obs, "env output reward": result.reward}, self.step)
        self.replay.add(self.obs, action, result)
        self.sampler.on_add(self.replay)
        agent.observe(result)
        if self.chunks is not None:
            self.chunks.clear(result.done)
        self.episodes.update(result)
        self.obs = result.obs
        self.step += self.envs_per_iteration
        self.iteration += 1

    def learn(self) -> None:
        if self.step < max(self.config.warmup_steps, self.learn_from):
            return
        self.update_credit += self.config.updates_per_step
        while self.update_credit >= 1.0:
            self.update_credit -= 1.0
            metrics = self.update()
            self.finite.record(metrics, self.step)
            for key, value in metrics.items():
                total = self._metric_sums.get(key)
                self._metric_sums[key] = value if total is None else total + value
            self._metric_count += 1

    def actor_trains(self) -> bool:
        """Whether actor updates run at all yet (fine-tuning holds them back while the critic adapts)."""
        return True

    def update(self) -> dict[str, torch.Tensor]:
        """One critic update on the sampler's critic batch (its TD errors go back to the sampler), and an
        actor update when due, on the sampler's actor batch (or the same one)."""
        agent, sampler, replay, cfg = self.agent, self.sampler, self.replay, self.config.agent
        window = (agent.backup_steps, cfg.gamma, cfg.chunk.size)
        batch = sampler.sample(replay, cfg.batch_size, *window)
        metrics = agent.critic_update(batch)
        sampler.update(batch, agent.last_td_abs)
        if self.actor_trains() and agent.actor_due():
            actor_batch = sampler.sample_actor(replay, cfg.batch_size, *window) or batch
            metrics.update(agent.actor_update(actor_batch.obs))
        return metrics

    def check_window(self) -> None:
        """Raise if an env output or an update metric went non-finite since the last window (one sync)."""
        self.finite.check(self.last_checkpoint)

    def pop_update_metrics(self) -> dict[str, float]:
        """Mean update metrics since the last call and the sampler's statistics, after the window's
        non-finite check; the only place the loop reads values back from the device."""
        self.check_window()
        if self.parallel is not None:
            return self.parallel.pop_metrics()
        values = {k: v / self._metric_count for k, v in self._metric_sums.items()} | self.sampler.metrics()
        values |= self.agent.metrics()
        self._metric_sums, self._metric_count = {}, 0
        if not values:
            return {}
        return dict(zip(values, torch.stack(list(values.values())).tolist(), strict=True))

    def run(self) -> Path:
        iterations = math.ceil(self.config.total_steps / self.envs_per_iteration)
        try:
            if self.config.pql.enabled:
                self.parallel = self._parallel_learners().start()
            for callback in self.callbacks:
                callback.on_start(self)
            while self.iteration < iterations:
                self.collect()
                if self.parallel is not None:
                    self.parallel.after_collect(self.iteration)
                else:
                    self.learn()
                    if self.threads is not None and self.step >= self.config.warmup_steps:
                        self.threads.step()
                stop = False
                try:
                    for callback in self.callbacks:
                        callback.on_iteration(self)
                except StopTraining:
                    stop = True
                if self.parallel_data is not None:
                    stop = self.parallel_data.any(stop)  # every rank ends at the same iteration
                if stop:
                    break
            for callback in self.callbacks:
                callback.on_end(self)
        except KeyboardInterrupt:
            self.save_checkpoint()
            raise
        finally:
            if self.parallel is not None:
                self.parallel.stop()
            self.run_dir.update_meta(threads=self.thread_summary())
            torch.set_num_threads(self._torch_threads)
            self.logger.close()
            self.env.close()
            self.eval_env.close()
            if self.parallel_data is not None:
                self.parallel_data.close()
        return self.path

    def _thread_policy(self) -> ThreadTuner | None:
        """`threads=N` fixes torch's CPU threads; 0 (auto) tunes them online between all cores and one
        when training on the CPU, and gives PQL's collector one (the learner processes need the cores)."""
        config = self.config
        if config.threads:
            torch.set_num_threads(config.threads)
        elif self.ranks is not None:
            # Ranks on one host share its cores; tuning each alone would have them fight over all of them.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.ranks.local_world))
        elif config.pql.enabled:
            torch.set_num_threads(1)
        elif self.env.device.type == "cpu" and self._torch_threads >= 2:
            return ThreadTuner(self._torch_threads)
        return None

    def thread_summary(self) -> dict[str, object]:
        """torch's CPU thread policy of this run, for meta.json."""
        if self.threads is not None:
            return self.threads.summary()
        policy = "fixed" if self.config.threads else "pql" if self.config.pql.enabled else "torch default"
        policy = "per rank" if self.ranks is not None and not self.config.threads else policy
        return {"policy": policy, "chosen": torch.get_num_threads()}

    def _parallel_learners(self) -> ParallelLearners:
        config, agent_config = self.config, self.config.agent
        job = LearnerJob(
            seed=config.env.seed,
            num_envs=self.env.num_envs,
            warmup_iterations=-(-config.warmup_steps // self.env.num_envs),
            batch_size=agent_config.batch_size,
            n_step=self.agent.backup_steps,
            gamma=agent_config.gamma,
            chunk=agent_config.chunk.size,
        )
        return ParallelLearners(self.agent, self.replay, config.pql, job, self.iteration)

    # --- evaluation and checkpoints --------------------------------------------------------------------
    @property
    def eval_seed(self) -> int:
        """Evaluation episodes are seeded apart from training's, and alike at every evaluation."""
        return self.config.env.seed + 10_000

    def evaluate(self, watch: Watch | None = None) -> float:
        """Mean return of one deterministic episode per eval env; `watch` sees every step (a film)."""
        policy = deterministic_policy(self.agent, self.eval_env)
        returns, success, cost = evaluate_episodes(policy, self.eval_env, self.eval_seed, watch)
        self.last_eval = float(returns.mean())
        self.last_eval_cost = float(cost.mean())
        self.last_eval_success = float(success.float().mean()) if success is not None else None
        return self.last_eval

    def save_checkpoint(self) -> Path:
        """Write checkpoint.pt atomically, refusing to overwrite a good checkpoint with non-finite weights.
        Parallel learners pause meanwhile and hand over their optimizer states."""
        if self.parallel is None:
            return self._save_checkpoint()
        with self.parallel.paused():
            return self._save_checkpoint()

    def _save_checkpoint(self) -> Path:
        """Under torchrun every rank writes its own (rank 0 in the run directory, rank r in `rank<r>/`),
        rank 0 last: until it has, each other rank keeps its previous file beside the new one, so a crash
        between the writes leaves a set of one step to resume from."""
        self.check_window()  # a checkpoint never captures a window that went non-finite
        check_finite(parameters_of(self.agent, "parameter"), self.step, self.last_checkpoint)
        path = self.path / CHECKPOINT
        state = training_state(self)
        if self.parallel_data is None or self.ranks is None:
            save_checkpoint(path, state)
        else:
            if not self.ranks.leader:
                if path.exists():
                    os.replace(path, path.with_name(PREVIOUS_CHECKPOINT))
                save_checkpoint(path, state)
            self.parallel_data.barrier()
            if self.ranks.leader:
                save_checkpoint(path, state)
        self.last_checkpoint = path
        return path

    def _restore(self, resume: Path) -> float:
        """Load this rank's checkpoint of the run at `resume`: rank r's of the step rank 0's holds."""
        if self.ranks is None or self.parallel_data is None:
            self.last_checkpoint = resume / CHECKPOINT
            return restore(self, resume / CHECKPOINT, world=1)
        if self.ranks.leader:
            elapsed = restore(self, resume / CHECKPOINT, world=self.ranks.world)
            self.parallel_data.from_leader(self.step)
            self.last_checkpoint = resume / CHECKPOINT
            return elapsed
        step = self.parallel_data.from_leader(None)
        folder = resume / rank_dir(self.ranks.rank)
        for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
            if (folder / name).is_file():
                elapsed = restore(self, folder / name, world=self.ranks.world)
                if self.step == step:
                    self.last_checkpoint = folder / name
                    return elapsed
        raise CheckpointError(
            f"{folder}: no checkpoint of step {step} (rank 0's, {resume / CHECKPOINT}) for rank {self.ranks.rank}"
        )


def grown_observation(run_dir: Path, env: VecEnv) -> list[tuple[int, int]]:
    """The columns `env` observes beyond those the run at `run_dir` trained on, as insertions
    (`q2real.agents.learners.widened`): policy terms appended after the old ones (`init_from` a run
    without an `action_history`, say), then critic-only terms appended after the old ones (a run that
    adds `critic_dynamics`). Empty when both observe the same; any other difference is refused, naming
    both term lists."""
    old = make(dataclasses.replace(load_run_config(run_dir).env, num_envs=1, device="cpu", backend="mujoco"))
    try:
        before = [_terms(old.obs_names, old.obs_dims), _terms(old.critic_names, old.critic_dims)]
        columns = [old.policy_obs_dim, old.obs_dim]
    finally:
        old.close()
    now = [_terms(env.obs_names, env.obs_dims), _terms(env.critic_names, env.critic_dims)]
    insertions = []
    for kind, was, is_, column in zip(("policy", "critic-only"), before, now, columns, strict=True):
        added = [name for name in is_ if name not in was]
        if list(is_) != [*was, *added]:
            raise ConfigError(
                f"init_from: {run_dir} observed {kind} terms {list(was)}; this run observes {list(is_)}: only "
                f"{kind} terms appended after the old ones can start from it"
            )
        if added:
            insertions.append((column, sum(is_[name] for name in added)))
    return insertions


def _terms(names: tuple[str, ...], dims: tuple[int, ...]) -> dict[str, int]:
    return dict(zip(names, dims, strict=True))


def curve_panels(config: TrainConfig) -> tuple[Panel, ...]:
    """What curves.png shows: returns, and for a constrained learner its episode cost against the limit."""
    limit = getattr(config.agent, "cost_limit", None)
    if limit is None:
        return (RETURNS,)
    return RETURNS, Panel("episode cost", ("episode_cost", "eval_cost"), limit=limit)


def train(config: TrainConfig, callbacks: Sequence[Callback] = ()) -> Trainer:
    """Train from scratch; returns the finished trainer (its `path` is the run directory)."""
    trainer = Trainer(config, callbacks)
    trainer.run()
    return trainer


def resume(run_dir: Path, config: TrainConfig, callbacks: Sequence[Callback] = ()) -> Trainer:
    """Continue a run from its checkpoint.pt, appending to its run directory."""
    trainer = Trainer(config, callbacks, resume=Path(run_dir))
    trainer.run()
    return trainer
