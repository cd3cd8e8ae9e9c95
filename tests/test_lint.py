"""ruff over the whole tree with the rules in pyproject.toml: lint and format both clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).parent / "ruff"


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_is_clean(command: list[str]) -> None:
    result = subprocess.run([str(RUFF), *command, str(ROOT)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, f"ruff {' '.join(command)}:\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
