"""The learner beside the deploy node: the run's learner fine-tuned on the robot's own transitions.

`q2real deploy BUNDLE --finetune` starts this as its own process with one torch thread (a learner
competing with the control loop for cores is what costs a torch process 5x;
`q2real.deploy_ros.learning.learner_process`). It is `Finetuner` with the robot in place of a
simulator: each iteration takes the next transition from the node's ring
(`q2real.contracts.transitions`) instead of stepping an env, so the replay, the critic-first
warm-up, the updates, checkpoints and logs are the training loop's own. The reward is the task's,
computed from what the node streamed at the tick after the action (joint states, the command and a
tracked object's position in the observation, forward kinematics on this machine's model:
`q2real.sim.streamed`), or with `reward=topic` the value the node received on its reward input
before that tick (a transition without one is not learned from). The stream is one continuing
episode, cut into the task's episode length for the logs only (a time limit: the critic still
bootstraps).

Every `publish_every` seconds after `actor_start` it exports the deterministic policy as version k of
the bundle (`vNNNN.onnx`), with a parity probe (recent robot observations and the commands the torch
policy gives for them) and the actor's state, and announces it in `candidate.json`. The node validates
and swaps it, or refuses it; when it rolls back to a good version (`rollback.json`) the actor and its
observation statistics are reloaded from that version, the critic keeps what it learned. The version
the node last judged good (`good.json`) is the anchor later candidates are kept near. It exits,
checkpointing, when the node's process is gone.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from q2real.agents.callbacks import Callback, EvalCallback, LogCallback, StopTraining
from q2real.agents.common.progress import Progress
from q2real.agents.common.run_dir import write_atomic
from q2real.agents.export import DeployPolicy, write_bundle
from q2real.agents.onrobot.finetune import FinetuneConfig, Finetuner, HandoffEval
from q2real.agents.train import Trainer
from q2real.configs.errors import Q2RealError
from q2real.configs.loader import ConfigError, load
from q2real.contracts.transitions import CANDIDATE, GOOD, READY, RING, ROLLBACK, RUN, TransitionRing, version_name
from q2real.sim.config import refuse_stepped_actions
from q2real.sim.streamed import StreamedState
from q2real.sim.vec_env import StepResult

READ_ROWS = 256
"""Rows taken from the ring at once (their rewards are computed together)."""
PROBE_ROWS = 64


class RobotLearner(Finetuner):
    on_robot = True

    def __init__(self, config: FinetuneConfig, directory: Path, publish_every: float, parent: int | None = None):
        self.directory, self.publish_every, self.parent = directory, publish_every, parent
        self.ring = TransitionRing(directory / RING)
        super().__init__(config)
        task = self.env.task  # pyright: ignore[reportAttributeAccessIssue]
        if self.ring.joints != task.spec.num_joints:
            raise ConfigError(
                f"{directory / RING}: the node streams {self.ring.joints} joints, task {self.config.env.task} "
                f"has {task.spec.num_joints}"
            )
        env = self.env
        env.require_policy_obs("learning on the robot, from what its node streams,")
        refuse_stepped_actions(self.config.env, "learning from the targets the node streams")
        self.streamed: StreamedState | None = None
        if task.robot_reward:
            self.streamed = StreamedState(task, env.obs_names, env.obs_dims, env.obs_sources)
        elif config.reward == "task":
            raise ConfigError(
                f"{config.run}: task {self.config.env.task}: its reward reads more than the node streams (joint "
                "states, the command, a tracked object's position), so it cannot be computed on the robot: "
                "send one on the node's reward input and set reward=topic"
            )
        if self.ring.obs_dim != self.env.obs_dim or self.ring.action_dim != self.env.action_dim:
            raise ConfigError(
                f"{directory / RING}: the node streams obs {self.ring.obs_dim} / action {self.ring.action_dim}, "
                f"run {config.run} has obs {self.env.obs_dim} / action {self.env.action_dim}"
            )
        self.task = task
        self.callbacks = [c for c in self.callbacks if not isinstance(c, (EvalCallback, HandoffEval))]
        self.callbacks = [StreamLog() if isinstance(c, LogCallback) else c for c in self.callbacks]
        self.callbacks.append(Publisher())
        self.read_at = self.ring.head  # transitions from the moment the learner is up
        self._pending: deque[tuple] = deque()
        self._previous: np.ndarray | None = None
        self._previous_index = -1
        self._since_episode = 0

    # --- transitions from the ring -------------------------------------------------------------------
    def collect(self) -> None:
        # Every row the node wrote gets its reward now, at the robot's pace however slow the updates are:
        # the node judges a version on trial by those rewards, and waits for them.
        self._fill(wait=False)
        while not self._pending:
            self._fill()
        obs, action, reward, next_obs, terminated = self._pending.popleft()
        self._since_episode += 1
        cut = self._since_episode >= self.task.config.episode_length
        if cut:
            self._since_episode = 0
        truncated = torch.full((1,), cut, device=self.env.device) & ~terminated
        result = StepResult(next_obs, next_obs, reward, terminated, truncated, torch.zeros(1, device=self.env.device))
        self.finite.record({"robot next_obs": result.next_obs, "robot reward": result.reward}, self.step)
        self.replay.add(obs, action, result)
        self.sampler.on_add(self.replay)
        self.agent.observe(result)
        self.episodes.update(result)
        self.obs = next_obs
        self.step += self.envs_per_iteration  # one robot
        self.iteration += 1

    def _fill(self, wait: bool = True) -> None:
        """Pair consecutive RUN rows into transitions; with `wait`, wait briefly when the node has written
        nothing new."""
        rows, self.read_at = self.ring.read(self.read_at, READ_ROWS)
        if not len(rows):
            if wait and self.parent is not None and os.getppid() != self.parent:
                raise StopTraining  # the node's process is gone: checkpoint and stop
            if wait:
                time.sleep(0.002)
            return
        first = self.read_at - len(rows)
        if self._previous is not None and self._previous_index == first - 1:
            rows_with_previous = np.concatenate([self._previous[None], rows])
            start = first - 1
        else:
            rows_with_previous, start = rows, first
        self._previous, self._previous_index = rows[-1].copy(), self.read_at - 1
        before, after = rows_with_previous[:-1], rows_with_previous[1:]
        pair = (before["tick"] + 1 == after["tick"]) & (before["flags"] & RUN > 0) & (after["flags"] & RUN > 0)
        topic = self.finetune.reward == "topic"
        if topic:
            pair &= np.isfinite(after["reward_in"])
        rewards = np.full(len(before), np.nan, dtype=np.float32)  # no transition starts at an unpaired row
        if pair.any():
            before, after = before[pair], after[pair]
            device = self.env.device  # one copy per batch of rows: the robot's data arrive on the host
            obs = torch.from_numpy(before["obs"].astype(np.float32)).to(device)
            sent = torch.from_numpy(before["action"].astype(np.float32)).to(device).clamp(-1.0, 1.0)
            wanted = torch.from_numpy(before["wanted"].astype(np.float32)).to(device).clamp(-1.0, 1.0)
            # As the run was trained: with the clamps in its env the policy's own action is the
            # transition's, the shield part of the dynamics, and its changes are charged.
            action = wanted if self.env.shield_in_loop else sent
            next_obs = torch.from_numpy(after["obs"].astype(np.float32)).to(device)
            if self.streamed is not None:  # the task's termination either way, its reward unless the topic's
                reward, terminated = self.streamed.reward(after["q"], after["qd"], after["obs"], sent)
                if self.env.shield_in_loop:
                    reward = reward - self.run_config.env.shield_penalty * (wanted - sent).abs().mean(-1)
            else:
                reward = torch.zeros(len(obs), device=device)
                terminated = torch.zeros(len(obs), dtype=torch.bool, device=device)
            if topic:
                reward = torch.from_numpy(after["reward_in"].astype(np.float32)).to(device)
            rewards[pair] = reward.cpu().numpy()
            for i in range(len(reward)):
                self._pending.append(
                    (obs[i : i + 1], action[i : i + 1], reward[i : i + 1], next_obs[i : i + 1], terminated[i : i + 1])
                )
        self.ring.write_rewards(start, rewards)

    # --- versions --------------------------------------------------------------------------------------
    def save_actor(self, version: int) -> None:
        """The actor (and its averaged copy, which the bundle runs, where there is one) and its observation
        statistics as version `version`, for a rollback to it."""
        path = self.directory / f"{version_name(version)}.pt"
        agent = self.agent
        state = {"actor": agent.actor.state_dict(), "obs_norm": agent.obs_norm.state_dict()}
        if agent.actor_average is not None:
            state["actor_average"] = agent.actor_average.state_dict()
        torch.save(state, path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)

    def publish(self, version: int) -> None:
        """Version `version` of the policy: actor state, bundle and parity probe, then the announcement."""
        stem = self.directory / version_name(version)
        agent = self.agent
        self.save_actor(version)
        size = self.replay.size
        recent = (torch.arange(max(0, size - PROBE_ROWS), size) + self.replay.pos - size) % self.replay.rows
        obs = self.replay.data["obs"][recent].reshape(-1, self.env.obs_dim).cpu()
        policy = DeployPolicy(agent, self.env)
        with torch.no_grad():
            commands = policy(obs)
        np.savez(stem.with_suffix(".probe.npz"), obs=obs.numpy(), commands=commands.numpy())
        write_bundle(self.config, self.env, agent, self.step, stem.with_suffix(".onnx"))
        announcement = {"version": version, "bundle": f"{stem.name}.onnx", "probe": f"{stem.name}.probe.npz"}
        progress = {"step": self.step, "updates": agent.updates}  # shown by the node's console and diagnostics
        write_atomic(self.directory / CANDIDATE, json.dumps(announcement | progress))

    def roll_back(self, version: int) -> None:
        state = self.saved_actor(version)
        self.agent.actor.load_state_dict(state["actor"])
        if self.agent.actor_average is not None:
            self.agent.actor_average.load_state_dict(state["actor_average"])
        self.agent.obs_norm.load_state_dict(state["obs_norm"])

    def anchor_to(self, version: int) -> None:
        """Keep the candidates near `version`, which the node judged good (`FinetuneConfig.anchor`)."""
        if self.agent.anchor is not None:
            state = self.saved_actor(version)
            self.agent.anchor.hold(state.get("actor_average", state["actor"]), state["obs_norm"])

    def saved_actor(self, version: int) -> dict:
        return torch.load(self.directory / f"{version_name(version)}.pt", weights_only=True)


class Publisher(Callback):
    """Publishes a version every `publish_every` seconds once the actor moves; follows the node's rollbacks."""

    def on_start(self, trainer: Trainer) -> None:
        assert isinstance(trainer, RobotLearner)
        self.version = 0
        trainer.save_actor(0)  # the handed-over policy: what a rollback to the deployed bundle reloads
        self.last = time.monotonic()
        self.seen = {ROLLBACK: "", GOOD: ""}

    def on_iteration(self, trainer: Trainer) -> None:
        assert isinstance(trainer, RobotLearner)
        for name, follow in ((ROLLBACK, trainer.roll_back), (GOOD, trainer.anchor_to)):
            path = trainer.directory / name
            if path.is_file() and (text := path.read_text()) != self.seen[name]:
                self.seen[name] = text
                follow(int(json.loads(text)["version"]))
        now = time.monotonic()
        if trainer.step >= trainer.finetune.actor_start and now - self.last >= trainer.publish_every:
            self.version += 1
            trainer.publish(self.version)
            self.last = now


class StreamLog(LogCallback):
    """The learner runs until the node stops it: its progress counts the robot's transitions taken in,
    with no total to reach and no time left to guess."""

    def on_start(self, trainer) -> None:
        super().on_start(trainer)
        self.progress.close()  # the bar toward training's total
        self.progress = Progress(None, "robot learner", unit="transition")  # this session's, from zero


ON_ROBOT = ("anchor=20",)
"""Where the learner beside a robot starts from other defaults than `q2real finetune` (the settings it is
given come after and win). Its actor is anchored to the last version the node judged good, an anchor
that moves with each acceptance: between swaps the robot runs that version with its noise, so the
learner learns offline, and a free actor climbs its critic's errors on actions nobody tried
(`bench/finetune.py --methods`). In `q2real finetune` the anchor would be the handed-over policy for
good, and it would hold the return there."""


def learner_config(overrides: list[str]) -> FinetuneConfig:
    """`ON_ROBOT`, then the node's settings, then a run as long as the robot's."""
    return load(FinetuneConfig, None, [*ON_ROBOT, *overrides, "total_steps=1000000000", "eval_every=0", "eval_envs=1"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="q2real-learner", description="the learner beside the deploy node")
    parser.add_argument("directory", type=Path, help="the node's fine-tuning directory (transitions.ring)")
    parser.add_argument("--publish-every", type=float, default=5.0, help="seconds between published versions")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process (the node) is gone")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="q2real finetune settings (run=RUN_DIR ...)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        config = learner_config(args.overrides)
        learner = RobotLearner(config, args.directory, args.publish_every, args.parent_pid)
    except Q2RealError as err:
        print(f"robot learner: error: {err}", file=sys.stderr, flush=True)
        return 2
    print(f"robot learner: fine-tuning {config.run} into {learner.path}", flush=True)
    write_atomic(args.directory / READY, json.dumps({"pid": os.getpid(), "run": str(learner.path)}))
    signal.signal(signal.SIGTERM, _interrupt)  # the node stopping: checkpoint, then exit
    try:
        learner.run()
    except KeyboardInterrupt:
        print(f"robot learner: stopped at robot step {learner.step}; checkpoint {learner.last_checkpoint}", flush=True)
    return 0


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
