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
- swaps a valid one in between two ticks and puts it on trial: it and the last good version take
  turns in segments of `segment` ticks, paired in alternating order, and each pair compares their
  mean reward per tick (computed by the learner from the joint states) and share of ticks the shield
  had to change (`q2real.deploy_ros.learning.trial`). Worse than tolerated by a one-sided bound over
  the pairs so far (or, in its first pairs, than the good version's level in the segments before the
  trial), it is rolled back at once and the learner told (it reloads that actor); no worse
  by the opposite bound, it is kept; undecided after `max_pairs`, it is rolled back.
  One version is on trial at a time; candidates published meanwhile wait, and the newest is taken next;
- notices the learner's death: the node keeps running, on the last good version (a version on trial
  is rolled back, since nobody can judge it any more).

Every version is kept in the fine-tuning directory (`v0000.onnx` is the bundle deployed), and every
event (swap, refusal, rollback, acceptance, the learner's exit) goes to the MCAP bag when recording.

With `learner_address` the learner runs on another machine: the process started here is then the
link (`q2real.deploy_ros.learning.link`), which mirrors this directory to it, and everything above is unchanged.
"""

from __future__ import annotations

import itertools
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
    GOOD,
    RING,
    ROLLBACK,
    RUN,
    TransitionRing,
    version_name,
    write_atomic,
)
from q2real.deploy_ros.bundle import PolicyBundle
from q2real.deploy_ros.learning.learner_process import Placement, launch, learner_command, learner_cpus
from q2real.deploy_ros.learning.trial import Segment, TrialRule, Verdict, new_runs, verdict
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
    bundle: PolicyBundle
    starts: list[int]
    """Ring rows at which each segment began (`new_runs` says whose it is); the last is running now."""
    verdict: Verdict = field(default_factory=lambda: Verdict("wait", "no pair finished yet"))
    """The comparison on the segments finished so far."""


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
        capacity = max(4 * settings.segment * (2 * settings.max_pairs + 1), 65_536)
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
        self.learner_progress = {"step": 0, "updates": 0}
        """The learner's env steps and updates at its newest announcement."""
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

    def diagnostics(self) -> dict[str, object]:
        counts, trial = self.counts, self.trial
        values: dict[str, object] = {
            "finetune.version": self.node.version,
            "finetune.good_version": self.good_version,
            "finetune.transitions": self.ring.head,
            "finetune.learner_steps": self.learner_progress["step"],
            "finetune.learner_updates": self.learner_progress["updates"],
            "finetune.versions": (
                f"{counts.swaps} tried, {counts.accepted} accepted, {counts.rollbacks} rolled back, "
                f"{counts.refused} refused"
            ),
        }
        if trial is not None:
            values["finetune.trial"] = f"version {trial.version}: {trial.verdict.detail}"
        elif not self.learner_alive:
            values["finetune.trial"] = "none: the learner is gone, the last good version runs"
        return values

    # --- the watcher -----------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(WATCH_PERIOD):
            try:
                self.check()
            except Exception as err:  # noqa: BLE001 - no version may run on unjudged because the judge died
                self._give_up(f"{type(err).__name__}: {err}")
                return

    def _give_up(self, reason: str) -> None:
        """The watcher cannot go on: the last good version runs from here, and no candidate is tried."""
        self.learner_alive = False
        if self.trial is not None:
            self._roll_back(f"the watcher failed ({reason}); the version on trial cannot be judged")
        self._event("stopped", self.node.version, f"on-robot learning stopped: the watcher failed ({reason})")

    def check(self) -> None:
        """One look at the learner, the version on trial and the newest candidate (the watcher's step)."""
        if self.learner_alive and self.learner is not None and self.learner.poll() is not None:
            self.learner_alive = False
            self._event("learner_exited", self.node.version, f"exit status {self.learner.returncode}")
            if self.trial is not None:
                self._roll_back("the learner is gone, so the version on trial cannot be judged")
        if self.trial is not None:
            self._judge()
        elif self.learner_alive and self._running_steadily():
            self._take_candidate()

    def _running_steadily(self) -> bool:
        """A trial starts only while the policy runs: its last `min_pairs` segments in RUN under the good
        version (a candidate taken while the robot waits or ramps would be thrown out for not running, and
        those segments are the level the trial's first pairs are held to; after a rollback, the robot
        runs the good version that long before the next trial)."""
        window, head = self.settings.min_pairs * self.settings.segment, self.ring.head
        if head < window:
            return False
        rows = self.ring.rows[np.arange(head - window, head) % self.ring.capacity]
        return bool(((rows["version"] == self.node.version) & ((rows["flags"] & RUN) > 0)).all())

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
            self.learner_progress = {k: int(announcement.get(k, 0)) for k in ("step", "updates")}
            bundle = self.validate(
                self.directory / Path(announcement["bundle"]).name, self.directory / Path(announcement["probe"]).name
            )
        except (BundleError, ValueError, KeyError, TypeError, OverflowError, OSError) as err:
            self.counts.refused += 1
            self._event("refused", self.node.version, str(err)[:500])
            return
        if version <= self.node.version:
            self.counts.refused += 1
            self._event("refused", version, f"version {version} is not newer than the running {self.node.version}")
            return
        previous = self.node.version
        self.node.swap(bundle, version)
        self.trial = Trial(version, bundle, [self.ring.head])
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
        """Hand over to the other version once a segment is done, then decide on the pairs finished."""
        trial = self.trial
        assert trial is not None
        if self._turn_over(trial):
            if new_runs(len(trial.starts)) != new_runs(len(trial.starts) - 1):
                self.node.swap(*self._version(trial, len(trial.starts)))
            trial.starts.append(self.ring.head)
        s = self.settings
        rule = TrialRule(s.min_pairs, s.max_pairs, s.confidence, s.return_drop, s.intervention_rise)
        trial.verdict = verdict(rule, self._pairs(trial), self._before(trial))
        if trial.verdict.decision == "abort":
            self._roll_back(trial.verdict.detail)
        elif trial.verdict.decision == "accept":
            if self.node.version != trial.version:
                self.node.swap(trial.bundle, trial.version)
            self._accept(trial, trial.verdict.detail)

    def _turn_over(self, trial: Trial) -> bool:
        """Whether the running segment is done and the next one starts. The new version takes over from the
        good one only once the rewards of every segment before the running one have come (a stalled or
        lagging learner leaves the good version running), and never for more than `max_pairs` turns; a
        segment of the new version is never drawn out waiting for them (the next, its own or the good
        version's, starts on time)."""
        if self.ring.head - trial.starts[-1] < self.settings.segment:
            return False
        following = len(trial.starts)
        if not new_runs(following) or new_runs(following - 1):
            return True
        return following < 2 * self.settings.max_pairs and self.ring.rewarded >= trial.starts[-1]

    def _version(self, trial: Trial, segment: int) -> tuple[PolicyBundle, int]:
        return (trial.bundle, trial.version) if new_runs(segment) else (self.good, self.good_version)

    def _before(self, trial: Trial) -> list[float]:
        """The good version's reward per tick over the `min_pairs` segments before the trial (without each
        one's first `settle` ticks, as on trial); those not yet rewarded, or not all its own, are left out."""
        s, start = self.settings, trial.starts[0]
        rewards, versions, rewarded = self.ring.rewards_since(start - s.min_pairs * s.segment)
        index = np.arange(rewarded - len(rewards), rewarded)
        flags = self.ring.rows["flags"][index % self.ring.capacity]
        level = []
        for end in range(start - (s.min_pairs - 1) * s.segment, start + 1, s.segment):
            rows = (index >= end - s.segment + s.settle) & (index < end)
            if end <= rewarded and (versions[rows] == self.good_version).all() and (flags[rows] & RUN).all():
                level.append(_mean(rewards[rows]))
        return level

    def _pairs(self, trial: Trial) -> list[tuple[Segment, Segment]]:
        """The trial's finished pairs of segments with rewards, as (the good version's, the new one's)."""
        rewards, versions, rewarded = self.ring.rewards_since(trial.starts[0])
        index = np.arange(rewarded - len(rewards), rewarded)
        flags = self.ring.rows["flags"][index % self.ring.capacity]
        finished: dict[bool, Segment] = {}
        pairs: list[tuple[Segment, Segment]] = []
        for k, (first, end) in enumerate(itertools.pairwise(trial.starts)):
            if end > rewarded:
                break
            version, first = self._version(trial, k)[1], first + self.settings.settle
            ran = (index >= first) & (index < end) & (versions == version) & ((flags & RUN) > 0)
            changed = float(((flags[ran] & CHANGED) > 0).mean()) if ran.any() else math.nan
            finished[new_runs(k)] = Segment(_mean(rewards[ran]), changed, int(ran.sum()), end - first)
            if k % 2:
                pairs.append((finished[False], finished[True]))
        return pairs

    def _accept(self, trial: Trial, detail: str) -> None:
        self.good, self.good_version = self.node.bundle, trial.version
        self.trial = None
        self.counts.accepted += 1
        write_atomic(self.directory / GOOD, json.dumps({"version": trial.version}))
        self._event("accepted", trial.version, detail)

    def _roll_back(self, detail: str) -> None:
        trial = self.trial
        assert trial is not None
        self.node.swap(self.good, self.good_version)
        self.trial = None
        self.counts.rollbacks += 1
        rollback = {"version": self.good_version, "refused": trial.version, "reason": detail}
        write_atomic(self.directory / ROLLBACK, json.dumps(rollback))
        write_atomic(self.directory / GOOD, json.dumps({"version": self.good_version}))
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
