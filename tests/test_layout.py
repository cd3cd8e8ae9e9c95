"""Imports point one way: robot facts at the bottom, the CLI at the top.

Every `q2real.*` import in a package's source (lazy imports inside functions included) is checked
against what that package may use. A new arrow that points back up fails here, naming the file and
line, before it turns into a cycle or drags ROS and onnxruntime into a learner.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUNDLE_SCHEMA = "deploy_ros.schema"
"""A module of `deploy_ros` that learners may use: the bundle's metadata document, which export writes."""
CHUNKS = "deploy_ros.chunks"
"""The other: how a chunk policy's actions are executed, so training runs exactly what the robot runs."""
TRANSITIONS = "deploy_ros.transitions"
"""And the robot's transition stream and version files, which the learner beside the node reads and writes."""

MAY_IMPORT: dict[str, set[str]] = {
    "configs": set(),
    "hardware": {"configs"},
    "safety": {"configs", "hardware"},
    "sim": {"configs", "hardware", "safety"},
    "agents": {"configs", "hardware", "sim", BUNDLE_SCHEMA, CHUNKS, TRANSITIONS},
    "residual": {"configs", "hardware", "sim", "agents", BUNDLE_SCHEMA, CHUNKS},
    "deploy_ros": {"configs", "hardware", "safety"},
    "gate": {"configs", "hardware", "safety", "sim", "agents", "residual", "deploy_ros"},
    "cli": {"configs", "hardware", "safety", "sim", "agents", "residual", "deploy_ros", "gate"},
}
"""Package -> the other q2real packages (or single modules) it may import; its own modules are always allowed."""
MODULE_MAY_ALSO_IMPORT: dict[str, set[str]] = {"deploy_ros.sim_robot": {"sim.registry", "sim.randomization"}}
"""Single modules with one more arrow: the sim-in-the-loop robot plays a task's world (its objects) and
the training env's dynamics shifts,
in its own process, never on a robot computer; the node's modules stay free of the simulator."""


def q2real_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module below `q2real.`) for every import of a q2real module in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [(node.lineno, name.removeprefix("q2real.")) for name in names if name.startswith("q2real.")]
    return found


def allowed(package: str, module: str, importer: str = "") -> bool:
    target = module.split(".")[0]
    if target == package:
        return True
    rules = MAY_IMPORT[package] | MODULE_MAY_ALSO_IMPORT.get(importer, set())
    return any(module == rule or module.startswith(rule + ".") or target == rule for rule in rules)


def test_every_package_folder_has_a_rule() -> None:
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert folders == set(MAY_IMPORT), "a new top-level package needs its place in MAY_IMPORT"


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_imports_point_down_the_layers(package: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: imports q2real.{module}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, module in q2real_imports(path)
        if not allowed(package, module, ".".join(path.relative_to(ROOT).with_suffix("").parts))
    ]
    assert not wrong, f"{package} may import only {sorted(MAY_IMPORT[package])}:\n" + "\n".join(wrong)


def test_the_rules_reject_an_arrow_that_points_up() -> None:
    assert not allowed("hardware", "deploy_ros.node")
    assert not allowed("agents", "deploy_ros.bundle")
    assert allowed("agents", "deploy_ros.schema")
    assert not allowed("safety", "sim")
    assert not allowed("sim", "deploy_ros.node")
    assert allowed("gate", "deploy_ros.session")
    assert not allowed("deploy_ros", "sim.registry", "deploy_ros.node")
    assert allowed("deploy_ros", "sim.registry", "deploy_ros.sim_robot")


def test_the_bundle_schema_needs_neither_torch_nor_onnxruntime() -> None:
    """Export (torch side) and the robot (onnxruntime side) share the schema; it must load without either."""
    code = (
        "import sys, q2real.deploy_ros.schema; "
        "heavy = sorted({'torch', 'onnxruntime', 'jax'} & set(sys.modules)); "
        "sys.exit(f'imported {heavy}' if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
