"""On-robot learning, the robot's side: what the node does while a learner fine-tunes its policy. The
control loop never waits on the learner. (The learner's side is `q2real-learner`, the trainer's
`Finetuner` with the robot in place of a simulator.)

The learner (`q2real-learner`, `q2real.agents.onrobot.robot_learner`) is a separate process with one torch
thread, started before the robot moves (a bad setting stops the deploy with the learner's own
error). Each tick the node appends its transition to the ring (a few stores, after the command went
out) and adds bounded exploration noise to the policy's action before the shield. A watcher thread,
off the tick:

- picks up the learner's newest candidate and validates it: it must load as a bundle, be for the
  same robot, observation, action mapping and control period, reproduce the learner's own outputs
  on the probe observations within `parity_tolerance`, and give finite commands in range; a refused
  candidate is counted, never run;
- swaps a valid one in between two ticks and puts it on trial: after `window` ticks its mean reward
  per tick (computed by the learner from the joint states) and its share of ticks the shield had to
  change are compared with the `window` ticks before it, all run by the last good version (after a
  rollback the good version first runs a fresh window: the robot may have changed since it was
  judged, so no older figure is a fair reference); worse by a margin, the node rolls back to the last
  good version and tells the learner (which reloads that actor). One version is on trial at a time;
  candidates published meanwhile wait, and the newest is taken next;
- notices the learner's death: the node keeps running, on the last good version (a version on trial
  is rolled back, since nobody can judge it any more).

Every version is kept in the fine-tuning directory (`v0000.onnx` is the bundle deployed), and every
event (swap, refusal, rollback, acceptance, the learner's exit) goes to the MCAP bag when recording.

With `learner_address` the learner runs on another machine: the process started here is then the
link (`q2real.deploy_ros.learning.link`), which mirrors this directory to it, and everything above is unchanged.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from q2real.configs.loader import ConfigError
from q2real.contracts.schema import BundleError, robot_from_metadata
from q2real.contracts.transitions import (
    CANDIDATE,
    CHANGED,
    RING,
    ROLLBACK,
    RUN,
    TransitionRing,
    version_name,
    write_atomic,
)
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.deploy_ros.learning.learner_process import Placement, launch, learner_command, learner_cpus
from q2real.deploy_ros.node import PolicyNode, Tick
from q2real.deploy_ros.settings import RobotLearningSettings
from q2real.hardware.spec import differences
from q2real.safety.flags import CLAMPS, Mode

WATCH_PERIOD = 0.2
"""Seconds between two looks of the watcher at the learner and its candidates."""
PROBE_MAX = 4096
"""Most probe observations a candidate may bring (a larger file is refused, not loaded)."""
SAME = ("observation", "action", "control_period", "chunk")
"""Metadata sections a candidate must share with the running bundle (besides its robot)."""


def _without_command_ranges(observation: Any) -> Any:
    """An observation section without its command terms' `ranges`: the node goes on checking commands
    by the running bundle's, so a candidate need not repeat them (one exported today carries ranges a
    running bundle from before them lacks)."""
    if not isinstance(observation, dict) or not isinstance(observation.get("terms"), list):
        return observation
    terms = []
    for term in observation["terms"]:
        source = term.get("source") if isinstance(term, dict) else None
        if isinstance(source, dict) and source.get("kind") == "command":
            term = term | {"source": {k: v for k, v in source.items() if k != "ranges"}}
        terms.append(term)
    return observation | {"terms": terms}


@dataclass
class Trial:
    version: int
    start: int
    """Ring row at which it took over."""


@dataclass
class Counts:
    swaps: int = 0
    refused: int = 0
    rollbacks: int = 0
    accepted: int = 0
    events: list[dict] = field(default_factory=list)


class RobotLearning:
    """The robot's side of on-robot learning for a node, built with it (`PolicyNode(...,
    learning=RobotLearning.attach(...))`); `start()` launches the learner, `close()` stops it."""

    @staticmethod
    def attach(
        settings: RobotLearningSettings, directory: Path | None = None, record=None
    ) -> Callable[[PolicyNode], RobotLearning]:
        """What `PolicyNode` calls with itself to build its fine-tuning."""
        return lambda node: RobotLearning(node, settings, directory, record)

    def __init__(self, node: PolicyNode, settings: RobotLearningSettings, directory: Path | None = None, record=None):
        if not settings.enabled:
            raise ConfigError("finetune.run or finetune.learner_address: the run to fine-tune or its learner is needed")
        info = node.bundle.info
        if info.chunk.size > 1:
            raise ConfigError(f"{node.bundle.path}: fine-tuning on the robot runs per-step policies, not chunks")
        self.node, self.settings, self.record = node, settings, record
        stamp = time.strftime("%Y%m%d-%H%M%S")
        # The run's own folder when the learner runs here, so its fine-tunings stay with it.
        home = Path(settings.run) if settings.run else Path("runs")
        self._named_here = not (directory or settings.directory)
        """The directory is this session's own, named by its start time: a failed start removes it."""
        if self._named_here:  # created here and nowhere else, even by a session started the same second
            home.mkdir(parents=True, exist_ok=True)
            self.directory = Path(tempfile.mkdtemp(prefix=f"finetune-{stamp}-", dir=home))
        else:
            self.directory = Path(directory or settings.directory or "")
            if (self.directory / RING).exists():
                raise ConfigError(f"finetune.directory: {self.directory} already holds a fine-tuning session")
            self.directory.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(node.bundle.path, self.directory / f"{version_name(0)}.onnx")
        capacity = max(4 * settings.window, 65_536)
        self.ring = TransitionRing(
            self.directory / RING, capacity, info.obs_dim, info.action_dim, len(node.names), create=True
        )
        self._rng = np.random.default_rng()
        self.good, self.good_version = node.bundle, 0
        self.trial: Trial | None = None
        self.counts = Counts()
        self.learner: subprocess.Popen | None = None
        self.learner_alive = True
        self._announced = ""
        self._reward_in: deque[float] = deque(maxlen=1)
        """The newest value from the reward input (a deque: appending and taking are atomic across threads)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the tick path ---------------------------------------------------------------------------------
    def explore(self, action: np.ndarray) -> np.ndarray:
        s = self.settings
        noise = np.clip(self._rng.normal(0.0, s.noise_std, action.shape), -s.noise_bound, s.noise_bound)
        return np.clip(action + noise, -1.0, 1.0)

    def on_reward(self, value: float) -> None:
        self._reward_in.append(value)

    def on_tick(self, tick: Tick) -> None:
        try:  # the newest reward since the last tick: the reward of the transition ending here
            reward_in = self._reward_in.pop()
        except IndexError:
            reward_in = math.nan
        if tick.position is None or tick.velocity is None:
            return
        run = tick.command.mode == Mode.RUN and tick.observation is not None
        flags = (RUN if run else 0) | (CHANGED if run and tick.command.flags & CLAMPS else 0)
        obs = tick.observation if tick.observation is not None else 0.0
        sent = np.clip(self.node.bundle.normalized(tick.values[None])[0], -1.0, 1.0)
        raw = tick.raw_action
        wanted = np.clip(raw, -1.0, 1.0) if run and raw is not None and np.isfinite(raw).all() else sent
        ring, version = self.ring, self.node.version
        ring.append(self.node.ticks, obs, sent, tick.position, tick.velocity, version, flags, reward_in, wanted)

    # --- the learner -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Launch the learner (or the link to a remote one) and wait until it is ready; its error, if
        any, stops the deploy."""
        s = self.settings
        if s.learner_address is None:
            assert s.run is not None
            command = learner_command(self.directory, s.run, s.publish_every, s.learner)
        else:
            command = [sys.executable, "-m", "q2real.deploy_ros.learning.link", "connect", str(self.directory)]
            command += ["--learner", s.learner_address, "--parent-pid", str(os.getpid())]
            for flag, path in (("--tls-root", s.tls_root), ("--tls-cert", s.tls_cert), ("--tls-key", s.tls_key)):
                command += [flag, path] if path else []
        try:
            cpus = learner_cpus(s.learner_cpus, self.node.config.realtime.cpus)
            self.learner = launch(command, self.directory, s.learner_startup, Placement(cpus, s.learner_nice))
        except Exception:
            if self._named_here:  # the error carries the learner's log; nothing else in it is worth keeping
                self.ring.close()
                shutil.rmtree(self.directory, ignore_errors=True)
            raise
        print(f"finetune: the learner runs on CPUs {sorted(cpus)} at nice {s.learner_nice}", flush=True)
        self._thread = threading.Thread(target=self._watch, name="q2real-finetune", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the watcher and the learner (SIGTERM: it checkpoints first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.learner is not None and self.learner.poll() is None:
            self.learner.terminate()
            try:
                self.learner.wait(30)
            except subprocess.TimeoutExpired:
                self.learner.kill()
                self.learner.wait()

    def summary(self) -> dict[str, object]:
        counts = self.counts
        return {
            "swaps": counts.swaps,
            "refused": counts.refused,
            "rollbacks": counts.rollbacks,
            "accepted": counts.accepted,
            "version": self.node.version,
            "good_version": self.good_version,
            "learner_exit": self.learner.poll() if self.learner is not None else None,
            "directory": str(self.directory),
            "events": list(counts.events),
        }

    # --- the watcher -----------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(WATCH_PERIOD):
            self.check()

    def check(self) -> None:
        """One look at the learner, the version on trial and the newest candidate (the watcher's step)."""
        if self.learner_alive and self.learner is not None and self.learner.poll() is not None:
            self.learner_alive = False
            self._event("learner_exited", self.node.version, f"exit status {self.learner.returncode}")
            if self.trial is not None:
                self._roll_back("the learner is gone, so the version on trial cannot be judged")
        if self.trial is not None:
            self._judge()
        elif self.learner_alive and self._baseline_ready():
            self._take_candidate()

    def _baseline_ready(self) -> bool:
        """A candidate is judged against the good version as it does now, on this robot: the last
        `window` ticks must all have run it (after a rollback, a fresh window first)."""
        window, head = self.settings.window, self.ring.head
        if head < window:
            return False
        versions = self.ring.rows["version"][np.arange(head - window, head) % self.ring.capacity]
        return bool((versions == self.node.version).all())

    def _take_candidate(self) -> None:
        path = self.directory / CANDIDATE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return
        if text == self._announced:
            return
        self._announced = text
        try:
            announcement = json.loads(text)
            version = int(announcement["version"])
            bundle = self.validate(
                self.directory / Path(announcement["bundle"]).name, self.directory / Path(announcement["probe"]).name
            )
        except (BundleError, ValueError, KeyError, TypeError, OSError) as err:
            self.counts.refused += 1
            self._event("refused", self.node.version, str(err)[:500])
            return
        if version <= self.node.version:
            self.counts.refused += 1
            self._event("refused", version, f"version {version} is not newer than the running {self.node.version}")
            return
        previous = self.node.version
        self.node.swap(bundle, version)
        self.trial = Trial(version, self.ring.head)
        self.counts.swaps += 1
        self._event("swapped", version, f"from version {previous}")

    def validate(self, bundle_path: Path, probe_path: Path) -> PolicyBundle:
        """The candidate as a bundle the node may run, or a BundleError saying why not."""
        running = self.node.bundle.info.metadata
        bundle = PolicyBundle(bundle_path, runtime=self.node.config.policy_runtime)
        meta = bundle.info.metadata
        robot = robot_from_metadata(meta, str(bundle_path))
        found = differences(robot, robot_from_metadata(running, str(self.node.bundle.path)))
        if found or meta["robot"]["sha256"] != running["robot"]["sha256"]:
            raise BundleError(f"{bundle_path}: metadata.robot differs from the running bundle's: {found or 'sha256'}")
        for key in SAME:
            mine, theirs = meta.get(key), running.get(key)
            if key == "observation":
                mine, theirs = _without_command_ranges(mine), _without_command_ranges(theirs)
            if mine != theirs:
                raise BundleError(f"{bundle_path}: metadata.{key} differs from the running bundle's")
        if self.node.config.cost_veto is not None and bundle.info.cost_critic is None:
            raise BundleError(f"{bundle_path}: cost_veto is set and the candidate has no cost critic")
        if probe_path.stat().st_size > 64 * PROBE_MAX * (bundle.info.obs_dim + bundle.info.action_dim) + 4096:
            raise BundleError(f"{probe_path}: larger than any parity probe")
        with np.load(probe_path, allow_pickle=False) as probe:
            obs, expected = np.asarray(probe["obs"]), np.asarray(probe["commands"])
        n, obs_dim, act_dim = len(obs), bundle.info.obs_dim, bundle.info.action_dim
        if not (1 <= n <= PROBE_MAX and obs.shape == (n, obs_dim) and expected.shape == (n, act_dim)):
            raise BundleError(f"{probe_path}: expected obs ({n}, {obs_dim}) and commands ({n}, {act_dim})")
        if not (np.isfinite(obs).all() and np.isfinite(expected).all()):
            raise BundleError(f"{probe_path}: the probe holds non-finite values")
        commands = bundle(obs.astype(np.float32))
        spread = obs + self._rng.normal(0.0, 1.0, obs.shape) * obs.std(0, keepdims=True)
        for name, out in (("probe", commands), ("perturbed probe", bundle(spread.astype(np.float32)))):
            actions = bundle.normalized(out)
            if not np.isfinite(out).all() or np.abs(actions).max() > 1.0 + 1e-4:
                raise BundleError(f"{bundle_path}: non-finite or out-of-range commands on the {name} observations")
        gap = float(np.abs(bundle.normalized(commands) - bundle.normalized(expected)).max())
        if not gap <= self.settings.parity_tolerance:
            raise BundleError(
                f"{bundle_path}: parity: its outputs differ from the learner's by {gap:.3g} action units "
                f"(tolerance {self.settings.parity_tolerance:g})"
            )
        return bundle

    def _judge(self) -> None:
        trial, window = self.trial, self.settings.window
        assert trial is not None
        base_start = trial.start - window
        rewards, versions, rewarded = self.ring.rewards_since(max(base_start, 0))
        if rewarded < trial.start + window:
            return
        first = rewarded - len(rewards)
        index = np.arange(first, rewarded)
        flags = self.ring.rows["flags"][index % self.ring.capacity]
        running = (flags & RUN) > 0
        before = running & (index < trial.start) & (index >= base_start)
        after = running & (index >= trial.start) & (index < trial.start + window) & (versions == trial.version)
        if after.sum() < window // 2:  # it took the robot out of RUN, or nobody let it run: never kept
            self._roll_back(f"the policy ran on {after.sum()} of its {window} ticks; a version is kept on its record")
            return
        if before.sum() < window // 2:
            self._roll_back(
                f"the policy ran on {before.sum()} of the {window} ticks before it: nothing to compare with"
            )
            return
        with np.errstate(all="ignore"):
            reward_before, reward_after = _mean(rewards[before]), _mean(rewards[after])
        changed = (flags & CHANGED) > 0
        rate_before, rate_after = changed[before].mean(), changed[after].mean()
        detail = (
            f"reward per tick {reward_after:.4g} vs {reward_before:.4g} before; "
            f"shield changed {rate_after:.1%} vs {rate_before:.1%} of ticks"
        )
        s = self.settings
        worse = reward_after < reward_before - s.return_drop * abs(reward_before)
        if not math.isfinite(reward_after) or worse or rate_after > rate_before + s.intervention_rise:
            self._roll_back(detail)
        else:
            self._accept(trial, detail)

    def _accept(self, trial: Trial, detail: str) -> None:
        self.good, self.good_version = self.node.bundle, trial.version
        self.trial = None
        self.counts.accepted += 1
        self._event("accepted", trial.version, detail)

    def _roll_back(self, detail: str) -> None:
        trial = self.trial
        assert trial is not None
        self.node.swap(self.good, self.good_version)
        self.trial = None
        self.counts.rollbacks += 1
        rollback = {"version": self.good_version, "refused": trial.version, "reason": detail}
        write_atomic(self.directory / ROLLBACK, json.dumps(rollback))
        self._event("rolled_back", self.good_version, f"version {trial.version}: {detail}")

    def _event(self, kind: str, version: int, detail: str) -> None:
        event = {"event": kind, "version": version, "tick": self.node.ticks, "detail": detail}
        self.counts.events.append(event)
        print(f"finetune: {kind} version {version}: {detail}", flush=True)
        if self.record is not None:
            self.record(event)


def _mean(values: np.ndarray) -> float:
    """Mean of the finite entries (the learner marks rows that start no transition NaN); NaN if none."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else math.nan
