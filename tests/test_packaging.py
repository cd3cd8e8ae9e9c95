"""The folders install as `q2real.<folder>` and nothing generic (`sim`, `agents`, ...) lands top-level."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["sim", "agents", "residual", "safety", "deploy_ros", "configs", "hardware", "gate", "cli"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_generic_names_are_not_importable_outside_the_repo(folder: str, tmp_path: Path) -> None:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({folder!r}) is not None)"
    assert subprocess.run([sys.executable, "-c", code], cwd=tmp_path).returncode == 0, f"top-level '{folder}' found"


def test_every_source_package_imports_under_the_namespace() -> None:
    packages = sorted(
        ".".join(init.parent.relative_to(ROOT).parts)
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
    )
    assert "sim.backends" in packages and "agents.common" in packages
    for package in packages:
        module = importlib.import_module(f"q2real.{package}")
        assert Path(module.__file__).resolve() == (ROOT / package.replace(".", "/") / "__init__.py").resolve()


def test_console_script_runs(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "q2real"
    out = subprocess.run([str(script), "presets"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "sac_pendulum_v1" in out.stdout
