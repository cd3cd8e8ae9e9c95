"""The fast tier stays fast: a test that is not marked slow and runs past the limit fails, naming itself."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def test_an_unmarked_test_over_the_limit_fails_and_a_slow_one_does_not(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("Q2REAL_FAST_LIMIT_S", "0.2")
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    mjx: mjx\n")
    pytester.makepyfile(
        "import time, pytest\n"
        "def test_quick(): pass\n"
        "def test_unmarked(): time.sleep(0.4)\n"
        "@pytest.mark.slow\n"
        "def test_marked(): time.sleep(0.4)\n"
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*test_unmarked took 0.4 s*over the fast tier's 0.2 s: mark it @pytest.mark.slow*"])
