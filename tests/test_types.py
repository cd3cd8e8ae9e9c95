"""pyright's basic checks over the package, clean (`python tests/test_types.py` prints its report).

Two things a static checker cannot see by itself are prepared in a temporary folder first: the
`q2real.<folder>` namespace, which setuptools maps at import time (the sources are copied into a
`q2real/` tree, so each module is checked under its import name; the report names the repo's files),
and MuJoCo's compiled submodules, which ship no stubs (generated from the installed
extension modules by pybind11-stubgen; MuJoCo's Python sources are read as they are). The rules
themselves are `[tool.basedpyright]` in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
"""Every top-level package folder (each is `q2real.<folder>`)."""
BIN = Path(sys.executable).parent


def typecheck(work: Path) -> tuple[dict, list[str]]:
    """basedpyright over the package (copied under `work`, with MuJoCo stubs): its summary and diagnostics."""
    package = work / "paths" / "q2real"
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, package / folder, ignore=_not_python)
    stubs = work / "stubs"
    mujoco = Path(importlib.util.find_spec("mujoco").origin).parent  # type: ignore[union-attr,arg-type]
    compiled = sorted(f"mujoco.{so.name.split('.')[0]}" for so in mujoco.glob("_*.so"))
    subprocess.run(
        [str(BIN / "pybind11-stubgen"), *compiled, "-o", str(stubs), "--ignore-all-errors"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    config = work / "pyrightconfig.json"
    settings = {
        "extends": str(ROOT / "pyproject.toml"),
        "include": [str(package)],
        "exclude": [str(package / "deploy_ros" / "ros2"), "**/__pycache__"],
        "extraPaths": [str(work / "paths")],
        "stubPath": str(stubs),
    }
    config.write_text(json.dumps(settings))
    command = [str(BIN / "basedpyright"), "--project", str(config), "--pythonpath", sys.executable, "--outputjson"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"basedpyright gave no report:\n{result.stdout[-3000:]}{result.stderr[-3000:]}") from None
    lines = [
        f"{d['file'].replace(f'{package}/', f'{ROOT}/')}:{d['range']['start']['line'] + 1}: "
        f"{d['severity']}: {d['message']} ({d.get('rule', '')})"
        for d in report["generalDiagnostics"]
    ]
    return report["summary"], lines


def _not_python(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if not (n.endswith((".py", ".pyi")) or (Path(folder) / n).is_dir())]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pyright_basic_is_clean(tmp_path: Path) -> None:
    summary, diagnostics = typecheck(tmp_path)
    found = (p for folder in FOLDERS for pattern in ("*.py", "*.pyi") for p in (ROOT / folder).rglob(pattern))
    sources = [p for p in found if "ros2" not in p.parts]  # .pyi: the generated link_pb2 stub
    assert summary["filesAnalyzed"] == len(sources), summary  # the whole package, not an empty include
    assert summary["errorCount"] == 0, "\n".join(diagnostics)


if __name__ == "__main__":
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="q2real-types-"))
    try:
        summary, diagnostics = typecheck(work)
    finally:
        shutil.rmtree(work)
    print(*diagnostics, sep="\n")
    print(f"{summary['filesAnalyzed']} files, {summary['errorCount']} errors, {summary['warningCount']} warnings")
    sys.exit(1 if summary["errorCount"] else 0)
