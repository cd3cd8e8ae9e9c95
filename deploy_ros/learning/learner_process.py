"""The learner's process beside the node: its command line, where it runs, and its start.

Both ends of on-robot learning start it the same way: the node on the robot (`RobotLearning.start`),
and the workstation's end of the link for a remote robot (`Relay`), so a learner that fails to load
stops either with its own log.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from q2real.configs.loader import ConfigError
from q2real.contracts.transitions import READY
from q2real.deploy_ros.programs import LEARNER, program

LOG = "learner.log"


def learner_command(directory: Path, run: str, publish_every: float, overrides: tuple[str, ...]) -> list[str]:
    """The learner process fine-tuning `run` on the transitions in `directory`; it exits with this process."""
    command = [program(LEARNER), "--publish-every", str(publish_every)]
    command += ["--parent-pid", str(os.getpid()), str(directory)]
    return [*command, f"run={run}", f"log.root={directory}", "log.name=learner", *overrides]


@dataclass(frozen=True)
class Placement:
    """Where a process beside the node runs: its CPUs and its niceness above the node's, under the
    normal scheduler."""

    cpus: frozenset[int]
    nice: int

    def apply(self, pid: int) -> None:
        """Place every thread of `pid` (just started: its interpreter has not spawned any yet; those it
        starts later inherit). A child of a SCHED_FIFO node would inherit FIFO too: a CPU-bound learner
        at real-time priority would starve the node, so it goes back to the normal scheduler."""
        for task in os.listdir(f"/proc/{pid}/task"):
            tid = int(task)
            if os.sched_getscheduler(tid) != os.SCHED_OTHER:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.sched_setaffinity(tid, self.cpus)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + self.nice))


def learner_cpus(wanted: tuple[int, ...] | None, node_cpus: tuple[int, ...]) -> frozenset[int]:
    """`finetune.learner_cpus`, or by default the CPUs the node leaves free (`RobotLearningSettings`)."""
    machine = set(range(os.cpu_count() or 1))
    if wanted is not None:
        missing = sorted(set(wanted) - machine)
        if missing:
            raise ConfigError(f"finetune.learner_cpus: this machine has no CPUs {missing} (it has {sorted(machine)})")
        return frozenset(wanted)
    # A pinned node's own affinity no longer shows the machine's other CPUs.
    free = machine - set(node_cpus) if node_cpus else os.sched_getaffinity(0) - {min(os.sched_getaffinity(0))}
    return frozenset(free or os.sched_getaffinity(0))


def launch(command: list[str], directory: Path, startup: float, placement: Placement | None = None) -> subprocess.Popen:
    """Start `command` with one thread per math library (placed beside the node, if `placement`), its
    output in `directory`/learner.log, and wait for its `learner.ready`; a ConfigError with the end of
    its log when it exits or is late."""
    log = open(directory / LOG, "w")  # noqa: SIM115 - the child writes to it for its whole life
    environment = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
    log.close()
    if placement is not None:
        try:
            placement.apply(process.pid)
        except OSError as err:
            process.kill()
            process.wait()
            raise ConfigError(
                f"finetune: the learner could not be placed on CPUs {sorted(placement.cpus)}: {err.strerror}"
                " (set finetune.learner_cpus to CPUs this process may use)"
            ) from None
    deadline = time.monotonic() + startup
    while not (directory / READY).exists():
        if process.poll() is not None:
            tail = (directory / LOG).read_text()[-1500:]
            raise ConfigError(f"finetune: the learner did not start (exit {process.returncode}):\n{tail}")
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise ConfigError(f"finetune.learner_startup: the learner was not ready in {startup:g} s")
        time.sleep(0.1)
    return process
