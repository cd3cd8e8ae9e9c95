"""Parallel Q-Learning (Li et al., 2023): data collection, critic learning and policy learning at once.

The training process keeps collecting (it is PQL's *actor*: steps the batched env with the newest
policy and writes replay) and runs the usual callbacks, while two learner processes update the
same agent: the *V-learner* takes critic steps (and the target network's Polyak step), the
*P-learner* takes policy steps (and e.g. SAC's temperature) against the newest critic. The agent's
parameters and normalizer statistics and the replay storage live in shared memory, so weights
flow without messages and nobody waits for a copy (reads may see a step half-applied, as in
Hogwild and in PQL's own asynchronous weight sync). Separate processes, not threads: on a CPU the
GIL would otherwise serialize three small-network loops.

Speed-ratio controller: with I vectorized env steps, C critic updates and P policy updates, the
V-learner keeps C ~ `critic_updates_per_step` x I and the P-learner keeps P ~ C /
`critic_updates_per_policy_update`; whichever side runs more than `slack` updates ahead waits
(the collector too, when the critic falls behind). Counting, not timing, so the ratios hold on any
machine; the measured ratios and waiting fractions are logged.

Any learner error (including non-finite losses) stops every process and is raised in the
training process; Ctrl-C there stops the learners, writes a final checkpoint and leaves no children.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from q2real.agents.common.actor_critic import ActorCritic
from q2real.agents.common.guard import FiniteFlags
from q2real.agents.common.replay import ReplayStorage
from q2real.agents.common.samplers import UniformSampler
from q2real.configs.errors import Q2RealError

# Slots of the shared counter tensor.
ITERATIONS, CRITIC, POLICY, STOP, PAUSE, WAIT_COLLECT, WAIT_CRITIC, WAIT_POLICY = range(8)
_POLL = 2e-4


@dataclass
class PQLConfig:
    enabled: bool = False
    """Run the learners concurrently with collection (any learner: sac, td3, ddpg, flashsac)."""
    critic_updates_per_step: float = 1.0
    """beta(critic updates : vectorized env steps); replaces `updates_per_step` when enabled."""
    critic_updates_per_policy_update: float = 2.0
    """beta(critic : policy updates); replaces the learner's `policy_delay` when enabled."""
    slack: int = 20
    """Updates a side may run ahead of its target ratio before it waits."""
    learner_threads: int = 1
    """torch intra-op threads per learner process."""

    def validate(self) -> None:
        for key in ("critic_updates_per_step", "critic_updates_per_policy_update"):
            if not 0 < getattr(self, key) < math.inf:
                raise ValueError(f"pql.{key}: expected > 0 and finite, got {getattr(self, key)}")
        for key in ("slack", "learner_threads"):
            if getattr(self, key) < 1:
                raise ValueError(f"pql.{key}: expected >= 1, got {getattr(self, key)}")


@dataclass(frozen=True)
class LearnerJob:
    """What the learner processes need to know of the run besides the agent and replay they share."""

    seed: int
    num_envs: int
    warmup_iterations: int
    """Vectorized env steps of random warm-up; updates count env steps after them, as the synchronous loop does."""
    batch_size: int
    n_step: int
    gamma: float
    chunk: int
    """Actions per replay window (a chunk learner's size; 1 per step)."""


class LearnerError(Q2RealError, RuntimeError):
    """A learner process failed; the message carries its traceback."""


def _learner(
    role: str, agent, replay, counters, config: PQLConfig, job: LearnerJob, parent: int, errors, outbox
) -> None:
    """Entry point of a learner process: update until told to stop; report optimizer state on pause.
    `parent` is the training process (not os.getppid(): it may already be gone when this runs)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the training process
    outbox.cancel_join_thread()  # exiting never waits for the training process to drain the queue
    try:
        torch.set_num_threads(config.learner_threads)
        torch.manual_seed(job.seed + (1 if role == "critic" else 2))
        sampler = UniformSampler()
        mine = ["critic"] if role == "critic" else [k for k in agent.optimizers() if k != "critic"]
        beta_v, beta_p = config.critic_updates_per_step, config.critic_updates_per_policy_update
        sums: dict[str, torch.Tensor] = {}
        finite = FiniteFlags()
        count = 0
        while not counters[STOP]:
            if os.getppid() != parent:
                # The training process was killed (SIGKILL, SIGTERM): no orphan keeps running, and there
                # is nothing to hand over (a normal exit would block flushing queues nobody reads).
                os._exit(0)
            if counters[PAUSE]:
                outbox.put((role, {k: agent.optimizers()[k].state_dict() for k in mine}))
                while counters[PAUSE] and not counters[STOP] and os.getppid() == parent:
                    time.sleep(_POLL)
                continue
            steps, critic, policy = int(counters[ITERATIONS]), int(counters[CRITIC]), int(counters[POLICY])
            learned = steps - job.warmup_iterations  # env steps that count, as in the synchronous loop
            if role == "critic":
                wait = critic >= beta_v * learned + config.slack or critic >= beta_p * (policy + config.slack)
            else:
                wait = policy >= critic / beta_p + config.slack
            if wait or learned <= 0:
                counters[WAIT_CRITIC if role == "critic" else WAIT_POLICY] += 1
                time.sleep(_POLL)
                continue
            batch = sampler.sample(replay, job.batch_size, job.n_step, job.gamma, job.chunk)
            if role == "critic":
                metrics = agent.critic_update(batch)
            else:
                metrics = agent.actor_update(batch.obs)
            finite.record(metrics, steps * job.num_envs)
            counters[CRITIC if role == "critic" else POLICY] += 1
            for key, value in metrics.items():
                total = sums.get(key)
                sums[key] = value if total is None else total + value
            count += 1
            if count == 50:  # one read-back per 50 updates: the non-finite check and the metric means
                finite.check(None)
                means = (torch.stack(list(sums.values())) / count).tolist()
                outbox.put(("metrics", dict(zip(sums, means, strict=True))))
                sums, count = {}, 0
    except BaseException:
        errors.put(f"{role} learner failed:\n{traceback.format_exc()}")
        counters[STOP] = 1


class ParallelLearners:
    """The two learner processes over one agent and replay, and the collector's side of the ratio controller.

    The collector publishes its vectorized env-step count with `after_collect`; the agent's update
    counter follows the critic learner's."""

    def __init__(self, agent: ActorCritic, replay: ReplayStorage, config: PQLConfig, job: LearnerJob, iteration: int):
        self.agent, self.config, self.job = agent, config, job
        if agent.device.type == "cpu":
            agent.share_memory()
            replay.share_memory_()
        else:  # CUDA tensors reach the learners as IPC handles to the same memory; the cursor is on the CPU
            replay.cursor.share_memory_()
        self.counters = torch.zeros(8, dtype=torch.long).share_memory_()
        self.counters[ITERATIONS] = iteration
        self.counters[CRITIC] = agent.updates
        self.counters[POLICY] = int(agent.updates / config.critic_updates_per_policy_update)
        context = mp.get_context("spawn")
        self.errors, self.outbox = context.Queue(), context.Queue()
        self.processes = [
            context.Process(
                target=_learner,
                args=(role, agent, replay, self.counters, config, job, os.getpid(), self.errors, self.outbox),
                name=f"q2real-pql-{role}",
                daemon=True,
            )
            for role in ("critic", "policy")
        ]
        self._metric_sums: dict[str, float] = {}
        self._metric_count = 0
        self._last = self._snapshot()
        self._last_time = time.monotonic()

    def start(self) -> ParallelLearners:
        for process in self.processes:
            process.start()
        return self

    def _snapshot(self) -> list[int]:
        return [int(v) for v in self.counters]

    def after_collect(self, iteration: int) -> None:
        """Publish the vectorized env-step count; wait while the critic is too far behind; surface learner
        errors."""
        counters, beta = self.counters, self.config.critic_updates_per_step
        counters[ITERATIONS] = iteration
        learned = iteration - self.job.warmup_iterations
        while learned > 0 and learned * beta > counters[CRITIC] + self.config.slack:
            self.raise_errors()
            counters[WAIT_COLLECT] += 1
            time.sleep(_POLL)
        self.raise_errors()
        self.agent.updates = int(counters[CRITIC])

    def raise_errors(self) -> None:
        if self.counters[STOP]:
            try:
                message = self.errors.get(timeout=5)
            except queue.Empty:
                message = "a learner process stopped without a report"
            raise LearnerError(message)
        for process in self.processes:
            if not process.is_alive():
                raise LearnerError(f"{process.name} exited with code {process.exitcode}")

    def pop_metrics(self) -> dict[str, float]:
        """Mean learner metrics since the last call, plus the measured ratios and waiting counts."""
        with contextlib.suppress(queue.Empty):
            while True:
                self._take(self.outbox.get_nowait(), {})
        metrics = {k: v / self._metric_count for k, v in self._metric_sums.items()} if self._metric_count else {}
        self._metric_sums, self._metric_count = {}, 0
        now, snapshot = time.monotonic(), self._snapshot()
        delta = [a - b for a, b in zip(snapshot, self._last, strict=True)]
        seconds = max(now - self._last_time, 1e-9)
        if delta[ITERATIONS] and delta[CRITIC]:
            metrics["pql/critic_updates_per_step"] = delta[CRITIC] / delta[ITERATIONS]
            metrics["pql/critic_updates_per_policy_update"] = delta[CRITIC] / max(delta[POLICY], 1)
        metrics["pql/policy_updates_per_s"] = delta[POLICY] / seconds
        metrics["pql/collector_waits_per_s"] = delta[WAIT_COLLECT] / seconds
        self._last, self._last_time = snapshot, now
        return metrics

    def _take(self, item: tuple[str, dict], states: dict[str, dict]) -> None:
        kind, values = item
        if kind == "metrics":
            for key, value in values.items():
                self._metric_sums[key] = self._metric_sums.get(key, 0.0) + value
            self._metric_count += 1
        else:
            states[kind] = values

    @contextlib.contextmanager
    def paused(self):
        """Learners idle (after handing over their optimizer state) while a checkpoint is written."""
        self.counters[PAUSE] = 1
        try:
            states: dict[str, dict] = {}
            while len(states) < len(self.processes):
                self.raise_errors()
                with contextlib.suppress(queue.Empty):
                    self._take(self.outbox.get(timeout=0.1), states)
            optimizers = self.agent.optimizers()
            for optim_states in states.values():
                for name, state in optim_states.items():
                    optimizers[name].load_state_dict(state)
            self.agent.updates = int(self.counters[CRITIC])
            yield
        finally:
            self.counters[PAUSE] = 0

    def stop(self, timeout: float = 10.0) -> None:
        """Stop and join both learners; terminate (then kill) any that does not exit in time."""
        self.counters[STOP] = 1
        for process in self.processes:
            if process.pid is None:
                continue
            process.join(timeout)
            if process.is_alive():
                process.terminate()
                process.join(2)
            if process.is_alive():
                process.kill()
                process.join()
