"""Shared fixtures. MJX tests compile XLA programs, so envs are built once per module and kept small."""

from __future__ import annotations

import importlib._bootstrap
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

SLOW_FIXTURES = {"trained_pendulum"}
"""Fixtures that train to a return threshold: every test using one is in the slow tier."""
FIXTURE_RUN = Path(__file__).resolve().parent / "fixtures" / "pendulum_run"
"""A small trained SAC run committed with the tests (regenerate: tests/fixtures/make_pendulum_run.py)."""
REACH_RUN = Path(__file__).resolve().parent / "fixtures" / "panda_reach_run"
"""The transfer bench's positive control, trained from the `sac_panda_reach` preset: its config, metrics
and bundle (regenerate: `python bench/transfer.py --keep DIR`, then copy those four files of
DIR/panda_reach_positive here)."""

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def q2real_cli(*args: str) -> subprocess.CompletedProcess:
    """`q2real ARGS` in a fresh interpreter, as a user runs it: a test that renders must not share a process
    with one that set up OpenGL another way (robosuite's import does, and PyOpenGL binds once)."""
    return subprocess.run([sys.executable, "-m", "q2real.cli.main", *args], capture_output=True, text=True, timeout=600)


WORKER = os.environ.get("PYTEST_XDIST_WORKER")
"""Set in a pytest-xdist worker (`-n 2`): two tests run at once, one core each."""
FAST_LIMIT_S = float(os.environ.get("Q2REAL_FAST_LIMIT_S", "5"))
"""Most CPU seconds a test outside the slow tier may use (setup + call + teardown, `cpu_seconds`) before it
fails as mismarked. CPU time, unlike wall time, does not grow when other work shares the cores, so the
same limit holds alone, in a pytest-xdist worker beside a learning run, and beside whatever else the
machine runs."""
_PHASES = pytest.StashKey[dict[str, float]]()
_CLOCKS = pytest.StashKey[tuple[float, float]]()


def cpu_seconds() -> float:
    """CPU seconds used by this process (all its threads) and by the child processes it has waited for.

    All threads, because what a test starts in the background (torch's intra-op threads, a DDS executor,
    a numba compile) is its work. Children, because a test that runs q2real in a fresh interpreter or
    spawns a DDS peer holds its worker while that process works, and the fast tier waits for it: charging
    only the pytest process would let a test that computes for a minute in a subprocess pass as fast.
    Time spent waiting (a sleep, a child that sleeps, a peer's reply) is not charged: on a shared machine
    it measures the neighbours as much as the test. The kernel adds a child's time only once it is
    waited for (`subprocess.run`, `Popen.wait`), so a test that leaves a child unwaited passes its cost
    to whichever test reaps it."""
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


class ImportClock:
    """CPU seconds spent executing first imports, so the fast tier's guard charges a test only for what it
    costs itself: whichever test first imports torch._dynamo, MuJoCo Playground or JAX pays seconds that
    depend on its place in the run, not on its own work.

    It wraps `_find_and_load`, the one function both the `import` statement and `importlib.import_module`
    call for a module not yet in `sys.modules`; nested imports are counted once, in their outermost import.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = threading.local()
        self._find_and_load = importlib._bootstrap._find_and_load

    def install(self) -> None:
        importlib._bootstrap._find_and_load = self._timed  # type: ignore[attr-defined]

    def _timed(self, name: str, import_: Callable[..., ModuleType]) -> ModuleType:
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        start = cpu_seconds()
        try:
            return self._find_and_load(name, import_)
        finally:
            self._depth.n = depth
            if depth == 0:
                self.seconds += cpu_seconds() - start

    def counts(self, function: Callable) -> Callable:
        """`function`'s time counted as a first import's: a one-time cost that lands on whichever test
        comes first (compiling a policy program; later calls find it compiled)."""

        def timed(*args, **kwargs):
            start = cpu_seconds()
            try:
                return function(*args, **kwargs)
            finally:
                if getattr(self._depth, "n", 0) == 0:
                    self.seconds += cpu_seconds() - start

        return timed


IMPORT_CLOCK = ImportClock()
IMPORT_CLOCK.install()
_compiled_policy = importlib.import_module("q2real.deploy_ros.compiled_policy")
_compiled_policy.compile_program = IMPORT_CLOCK.counts(_compiled_policy.compile_program)


REALTIME_DIR = Path(__file__).resolve().parent / "deploy_ros"
"""Every slow test here runs the node, a DDS peer or the robot link in real time and bounds its period,
latency or deadline misses: it runs alone (`realtime`), after the rest of the suite."""


def pytest_configure(config: pytest.Config) -> None:
    if WORKER is None and config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        # The shield's kernels compile on first import (about 8 s on a clean clone) and numba caches
        # them: compiled here once, the workers and the node processes they start only load them.
        import q2real.safety.compiled  # noqa: F401
    if WORKER is not None:
        import torch

        # Two workers on two cores: a torch process with 2 threads beside a busy one runs 5x slower.
        torch.set_num_threads(1)
        # A DDS domain per worker (below the deploy tests' own, 100-232): two sim robots deployed at once
        # must not hear each other's joint states.
        os.environ["ROS_DOMAIN_ID"] = str(1 + int(WORKER.removeprefix("gw")))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """MJX compiles and trained-policy fixtures make a test slow wherever it lives; slow deploy tests are
    real-time, and those never run beside another test."""
    for item in items:
        if item.get_closest_marker("mjx") or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") and item.path.is_relative_to(REALTIME_DIR):
            item.add_marker(pytest.mark.realtime)
    if WORKER is not None:
        # Long runs first, so that at the end the short tests fill both workers rather than one idling
        # beside the last learning run.
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if WORKER is not None and item.get_closest_marker("realtime"):
        pytest.fail(
            f"{item.nodeid} holds real-time bounds and must run alone, not under pytest-xdist: run the realtime "
            "tests in their own pass (-m realtime) and the rest with -n (-m 'not realtime')",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    item.stash[_CLOCKS] = (cpu_seconds(), IMPORT_CLOCK.seconds)
    item.stash[_PHASES] = {}
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test without the slow marker that uses more than FAST_LIMIT_S of CPU fails, saying so: the fast
    tier stays fast only if what is slow is marked. Session fixtures built in a test's setup count against
    it; first imports do not (`ImportClock`). Every test's charge is a `cpu_s` property of its report
    (`--junitxml` writes it), the figures to size the limit by."""
    report = yield
    phases = item.stash[_PHASES]
    phases[call.when] = cpu_seconds() - item.stash[_CLOCKS][0] - sum(phases.values())
    if call.when != "teardown":
        return report
    imports = IMPORT_CLOCK.seconds - item.stash[_CLOCKS][1]
    own = sum(phases.values()) - imports
    report.user_properties.append(("cpu_s", f"{own:.2f}"))
    if own > FAST_LIMIT_S and not item.get_closest_marker("slow") and report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} used {own:.1f} s of CPU ({', '.join(f'{k} {v:.1f} s' for k, v in phases.items())}, "
            f"less {imports:.1f} s of first imports), over the fast tier's {FAST_LIMIT_S:g} s: mark it "
            "@pytest.mark.slow or make it faster"
        )
    return report


@pytest.fixture(scope="session")
def trained_pendulum(tmp_path_factory: pytest.TempPathFactory):
    """SAC trained on pendulum swing-up until its evaluation return reaches 300 (about 100 s on 2 cores).

    Session-scoped so that every test needing a freshly trained policy shares one run (the SAC learning
    test today; tests that only need a trained policy use the committed `pendulum_run`).
    """
    from q2real.agents.config import TrainConfig
    from q2real.agents.train import train
    from q2real.configs.loader import load

    overrides = [
        "algo=sac",
        "total_steps=35000",
        "eval_every=5000",
        "stop_return=300",
        "threads=1",
        f"log.root={tmp_path_factory.mktemp('trained')}",
        "log.name=sac-pendulum",
        "log.tensorboard=false",
        "sac.actor_hidden=[128,128]",
        "sac.critic_hidden=[128,128]",
    ]
    return train(load(TrainConfig, None, overrides))


@pytest.fixture(scope="session")
def pendulum_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the committed trained run (checkpoint, bundle, metrics), free for tests to write into.

    It swings the pendulum up (`tests/gate/test_fixture_run.py` checks that it still does), so tests
    of export, evaluation, the gate and the deploy node have a real policy without training one."""
    run = tmp_path_factory.mktemp("committed") / FIXTURE_RUN.name
    shutil.copytree(FIXTURE_RUN, run)
    return run


@pytest.fixture(scope="session")
def panda_reach_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the committed Panda reach bundle the transfer bench passes (`REACH_RUN`)."""
    run = tmp_path_factory.mktemp("committed") / REACH_RUN.name
    shutil.copytree(REACH_RUN, run)
    return run
