"""Real-time settings for the node's process, and garbage collection kept out of ticks.

On a robot computer the control loop shares CPUs with other ROS processes (and, when fine-tuning,
a learner). The settings follow ros2_control's real-time guide: pin the process to chosen CPUs,
run it under SCHED_FIFO so a busy neighbour cannot delay a wake-up, and lock its memory so no page
fault lands in a tick. They are applied to the calling thread before the node starts its threads
(DDS, diagnostics, recording), which inherit them. Each is optional, and each that the OS refuses
stops the node with the reason and the fix: a node that silently ran without the priority it was
configured for would fail only under load, on the robot.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import os
import sys

from q2real.configs.errors import Q2RealError
from q2real.deploy_ros.settings import RealtimeConfig

MCL_CURRENT, MCL_FUTURE = 1, 2


class RealtimeError(Q2RealError):
    """The OS refused a configured real-time setting."""


def apply(config: RealtimeConfig) -> list[str]:
    """Apply `config` to this thread (and the threads it starts later); returns what was applied."""
    applied = []
    sys.setswitchinterval(config.switch_interval)
    if config.cpus:
        available = os.sched_getaffinity(0)
        missing = sorted(set(config.cpus) - available)
        if missing:
            raise RealtimeError(
                f"realtime.cpus: CPUs {missing} are not available to this process (it may use {sorted(available)})"
            )
        os.sched_setaffinity(0, config.cpus)
        applied.append(f"CPUs {sorted(config.cpus)}")
    if config.priority:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(config.priority))
        except PermissionError as err:
            raise RealtimeError(
                f"realtime.priority={config.priority}: the OS refused SCHED_FIFO ({err.strerror}). Allow it for "
                "this user (e.g. '@realtime - rtprio 99' in /etc/security/limits.conf and the user in group "
                "realtime, as in ros2_control's real-time guide) or set realtime.priority=0"
            ) from None
        applied.append(f"SCHED_FIFO priority {config.priority}")
    if config.lock_memory:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mlockall(MCL_CURRENT | MCL_FUTURE) != 0:
            code = ctypes.get_errno()
            raise RealtimeError(
                f"realtime.lock_memory: the OS refused mlockall ({errno.errorcode.get(code, code)}: "
                f"{os.strerror(code)}). Raise the user's memlock limit (e.g. '@realtime - memlock unlimited' "
                "in /etc/security/limits.conf) or set realtime.lock_memory=false"
            )
        applied.append("memory locked")
    return applied


class Collector:
    """Python's cyclic garbage collector, run between ticks instead of wherever allocation trips it.

    `start` collects once and freezes the start-up heap (onnxruntime, numpy, DDS: tens of thousands of
    objects a full collection would otherwise walk, ~15 ms here, far past a 2 ms period), then
    disables automatic collection. `between_ticks` then collects the young generations with
    CPython's own thresholds, costing microseconds to ~0.2 ms, in the gap after a tick.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._was_enabled = gc.isenabled()
        self._threshold = gc.get_threshold()

    def start(self) -> None:
        if self.enabled:
            gc.collect()
            gc.freeze()
            gc.disable()

    def between_ticks(self) -> None:
        if not self.enabled:
            return
        young, middle, old = gc.get_count()
        first, second, third = self._threshold
        if young < first:
            return
        gc.collect(2 if old >= third else 1 if middle >= second else 0)

    def stop(self) -> None:
        if self.enabled:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()
