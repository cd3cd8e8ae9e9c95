"""The fast tier stays fast: a test that is not marked slow and uses CPU past the limit fails, naming itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
CONFTEST = Path(__file__).resolve().parent / "conftest.py"
BURN = """\
import sys, time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

if __name__ == "__main__":
    burn(float(sys.argv[1]))
"""
"""`burn` spins until the process has used that much more CPU; `python burn.py SECONDS` does it in a child."""
TESTS = """\
import importlib, os, signal, subprocess, sys, time, pytest
from burn import burn

def test_quick():
    pass

def test_unmarked():
    burn(0.2)

@pytest.mark.slow
def test_marked():
    burn(0.2)

def test_in_a_child():
    subprocess.run([sys.executable, "-S", "burn.py", "0.2"], check=True)

@pytest.fixture
def loaded():
    import heavy_setup

def test_imports_in_setup(loaded):
    pass

def test_imports_in_call():
    importlib.import_module("heavy_call")

def test_slow_beside_an_import():
    import csv
    burn(0.2)

def test_waits_beside_a_hog():
    hog, cpu = map(int, os.environ["HOG"].split())
    os.sched_setaffinity(0, {cpu})
    os.kill(hog, signal.SIGCONT)
    start, used = time.perf_counter(), time.process_time()
    burn(0.05)
    assert time.perf_counter() - start > 1.5 * (time.process_time() - used), "the hog did not share the core"
    subprocess.run([sys.executable, "-S", "-c", "import time; time.sleep(0.2)"], check=True)
    os.kill(hog, signal.SIGKILL)
    assert time.perf_counter() - start > 0.1, "the test held its worker no longer than the limit"
"""
"""Run with a 0.1 s limit: three fail (one burning in a child), the slow one and those that import or wait pass."""


def test_an_unmarked_test_over_the_cpu_limit_fails_and_a_waiting_or_slow_one_does_not(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit is on CPU, the test's own threads and the children it waited for: a test that works past
    it fails, one that waits (beside a process spinning on its core, on a sleeping child) passes however
    long it holds its worker. A heavy first import (torch's compiler, Playground, JAX) lands on whichever
    test runs first, so the guard leaves it out, in setup or in the call, yet still fails a test slow on
    its own work."""
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        # Stopped until the waiting test continues it: it spins for that test only, and this test, which
        # reaps it, is charged for no more.
        os.kill(hog.pid, signal.SIGSTOP)
        os.sched_setaffinity(hog.pid, {cpu})
        monkeypatch.setenv("HOG", f"{hog.pid} {cpu}")
        monkeypatch.setenv("Q2REAL_FAST_LIMIT_S", "0.1")
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the inner run is a plain one
        pytester.makeconftest(CONFTEST.read_text())
        pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    mjx: mjx\n")
        pytester.makepyfile(
            burn=BURN,
            heavy_setup="from burn import burn\nimport heavy_nested\nburn(0.1)\n",
            heavy_nested="from burn import burn\nburn(0.1)\n",
            heavy_call="from burn import burn\nburn(0.2)\n",
            test_tiers=TESTS,
        )
        # Without the plugins it has no use for, the inner run starts on less CPU, which is charged here.
        result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:hypothesispytest", "test_tiers.py")
    finally:
        hog.kill()
        hog.wait()
    result.assert_outcomes(passed=8, errors=3)  # the three that fail pass their call
    result.stdout.fnmatch_lines(["*test_unmarked used 0.2 s of CPU*over the fast tier's 0.1 s: mark it*slow*"])
    result.stdout.fnmatch_lines(["*test_in_a_child used 0.2 s of CPU*"])
    result.stdout.fnmatch_lines(["*test_slow_beside_an_import used 0.2 s of CPU*of first imports), over*"])


@pytest.mark.slow  # two pytest runs in subprocesses, one of them importing torch as a worker does: 6 s
def test_a_slow_deploy_test_is_realtime_and_fails_inside_a_parallel_worker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite's first pass runs under pytest-xdist (`-n 2 -m 'not realtime'`): a real-time test that
    slipped into it would measure its latency beside a learning run, so it fails instead, saying why."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    mjx: mjx\n    realtime: realtime\n")
    pytester.mkdir("deploy_ros")
    pytester.makepyfile(
        **{
            "deploy_ros/test_loop": "import pytest\n@pytest.mark.slow\ndef test_loop(): pass\ndef test_quick(): pass\n",
            "test_elsewhere": "import pytest\n@pytest.mark.slow\ndef test_learns(): pass\n",
        }
    )
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.runpytest_subprocess("-m", "realtime").assert_outcomes(passed=1, deselected=2)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*test_loop holds real-time bounds and must run alone, not under pytest-xdist*"])
