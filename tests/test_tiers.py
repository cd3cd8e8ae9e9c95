"""The fast tier stays fast: a test that is not marked slow and runs past the limit fails, naming itself."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def test_an_unmarked_test_over_the_limit_fails_and_a_slow_one_does_not(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also: a heavy first import (torch's compiler, Playground, JAX) lands on whichever test runs first,
    so the guard leaves it out, in setup or in the call, yet still fails a test slow on its own work."""
    monkeypatch.setenv("Q2REAL_FAST_LIMIT_S", "0.2")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the inner run is a plain one
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    mjx: mjx\n")
    pytester.makepyfile(
        heavy_setup="import time\nimport heavy_nested\ntime.sleep(0.2)\n",
        heavy_nested="import time\ntime.sleep(0.2)\n",
        heavy_call="import time\ntime.sleep(0.4)\n",
        test_tiers=(
            "import importlib, time, pytest\n"
            "def test_quick(): pass\n"
            "def test_unmarked(): time.sleep(0.4)\n"
            "@pytest.mark.slow\n"
            "def test_marked(): time.sleep(0.4)\n"
            "@pytest.fixture\n"
            "def loaded():\n"
            "    import heavy_setup\n"
            "def test_imports_in_setup(loaded): pass\n"
            "def test_imports_in_call():\n"
            "    importlib.import_module('heavy_call')\n"
            "def test_slow_beside_an_import():\n"
            "    import csv\n"
            "    time.sleep(0.4)\n"
        ),
    )
    result = pytester.runpytest_subprocess("test_tiers.py")
    result.assert_outcomes(passed=6, errors=2)
    result.stdout.fnmatch_lines(["*test_unmarked took 0.4 s*over the fast tier's 0.2 s: mark it @pytest.mark.slow*"])
    result.stdout.fnmatch_lines(["*test_slow_beside_an_import took 0.4 s*of first imports), over the fast tier's*"])


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
