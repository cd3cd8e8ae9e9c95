"""Imports point one way: robot facts at the bottom, the CLI at the top.

Every reference to a q2real module in a package's source is checked against what that package may
use: `import` statements (lazy ones inside functions included), relative imports (resolved),
`importlib.import_module` / `__import__` calls and `-m q2real.…` module strings that start a process.
A new arrow that points back up fails here, naming the file and line, before it turns into a cycle
or drags ROS and onnxruntime into a learner. There are no exceptions: what both sides share lives in
`contracts`, and the programs the robot side starts by name are console scripts
(`q2real.deploy_ros.programs`).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MAY_IMPORT: dict[str, set[str]] = {
    "configs": set(),
    "hardware": {"configs"},
    "contracts": {"configs", "hardware"},
    "safety": {"configs", "hardware"},
    "sim": {"configs", "hardware", "safety"},
    "agents": {"configs", "hardware", "contracts", "sim"},
    "residual": {"configs", "hardware", "contracts", "sim", "agents"},
    "deploy_ros": {"configs", "hardware", "contracts", "safety"},
    "gate": {"configs", "hardware", "contracts", "safety", "sim", "agents", "residual", "deploy_ros"},
    "cli": {"configs", "hardware", "contracts", "safety", "sim", "agents", "residual", "deploy_ros", "gate"},
}
"""Package -> the other q2real packages it may import; its own modules are always allowed."""

MODULE_STRING = re.compile(r"(?:^|-m\s+)q2real((?:\.\w+)+)$")
"""A string that names a module to import or run: `q2real.x.y` alone, or `-m q2real.x.y`."""


def _module_of(path: Path, root: Path) -> list[str]:
    return list(path.relative_to(root).with_suffix("").parts)


def q2real_references(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module below `q2real.`) for every reference to a q2real module in `path`, a file of the tree
    at `root`."""
    found: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolved against the file's own package
                here = _module_of(path, root)
                module = ".".join(["q2real", *here[: len(here) - node.level], *([module] if module else [])])
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            function = node.func
            called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = MODULE_STRING.search(node.value.strip())
            if match:
                names = ["q2real" + match.group(1)]
        found |= {(node.lineno, name.removeprefix("q2real.")) for name in names if name.startswith("q2real.")}
    # Only modules of q2real's packages: a gRPC service named `q2real.link.Learner` is not one.
    return sorted((line, module) for line, module in found if module.split(".")[0] in MAY_IMPORT)


def allowed(package: str, module: str) -> bool:
    target = module.split(".")[0]
    return target == package or target in MAY_IMPORT[package]


def test_every_package_folder_has_a_rule() -> None:
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert folders == set(MAY_IMPORT), "a new top-level package needs its place in MAY_IMPORT"


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_imports_point_down_the_layers(package: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: refers to q2real.{module}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, module in q2real_references(path)
        if not allowed(package, module)
    ]
    assert not wrong, f"{package} may import only {sorted(MAY_IMPORT[package])}:\n" + "\n".join(wrong)


def test_the_rules_reject_an_arrow_that_points_up() -> None:
    assert not allowed("hardware", "deploy_ros.node")
    assert not allowed("agents", "deploy_ros.bundle")
    assert allowed("agents", "contracts.schema")
    assert not allowed("contracts", "deploy_ros.node")
    assert not allowed("safety", "sim")
    assert not allowed("sim", "deploy_ros.node")
    assert not allowed("deploy_ros", "sim.registry")
    assert not allowed("deploy_ros", "agents.onrobot.robot_learner")
    assert allowed("gate", "deploy_ros.session")


def test_every_kind_of_reference_is_seen(tmp_path: Path) -> None:
    """Each way a module can reach another is found; a docstring that names a module is not one. The probe
    is a deploy_ros module of a tree in `tmp_path`: in the checkout, the lint and the layering test running
    beside this one would find it."""
    source = tmp_path / "deploy_ros" / "_probe_references.py"
    source.parent.mkdir()
    source.write_text(
        '"""Mentions `q2real.agents.algos.sac` in prose."""\n'
        "import importlib\n"
        "from .node import PolicyNode\n"
        "from ..sim import registry\n"
        "importlib.import_module('q2real.sim.registry')\n"
        "__import__('q2real.residual')\n"
        "COMMAND = ['python', '-m', 'q2real.agents.onrobot.robot_learner']\n"
        "LINE = 'python -m q2real.gate.sim_robot'\n"
    )
    found = q2real_references(source, root=tmp_path)
    assert found == [
        (3, "deploy_ros.node"),
        (3, "deploy_ros.node.PolicyNode"),
        (4, "sim"),
        (4, "sim.registry"),
        (5, "sim.registry"),
        (6, "residual"),
        (7, "agents.onrobot.robot_learner"),
        (8, "gate.sim_robot"),
    ]
    assert [m for _, m in found if not allowed("deploy_ros", m)] == [
        "sim",
        "sim.registry",
        "sim.registry",
        "residual",
        "agents.onrobot.robot_learner",
        "gate.sim_robot",
    ]


DEPLOY_WINGS = {"transport", "watch", "learning"}
"""deploy_ros's sub-packages around the node core at its top: the wire, the bag and the operator's tools, and
on-robot learning."""


def test_the_deploy_core_imports_none_of_its_wings() -> None:
    """Each wing imports the node core, never the reverse, so the core runs and is tested without a transport,
    a bag or a learner; only `session`, which puts a node together for `q2real deploy`, reaches into them."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: refers to q2real.{module}"
        for path in sorted((ROOT / "deploy_ros").glob("*.py"))
        if path.stem != "session"
        for line, module in q2real_references(path)
        if module.split(".")[:2] in [["deploy_ros", wing] for wing in DEPLOY_WINGS]
    ]
    assert not wrong, "the deploy core imports a wing:\n" + "\n".join(wrong)


LIGHT = {
    "q2real.safety": "the shield, which the node runs on a robot computer",
    "q2real.contracts.schema": "the bundle schema, which export (torch) and the node (onnxruntime) share",
    "q2real.contracts.chunks": "the chunk queue, which training and the node both run",
    "q2real.contracts.transitions": "the transition ring, which the node writes and the learner reads",
    "q2real.hardware": "the robot facts",
}


@pytest.mark.parametrize("module", sorted(LIGHT))
def test_the_robot_side_contracts_load_without_the_heavy_runtimes(module: str) -> None:
    """Each loads without MuJoCo, torch, onnxruntime or JAX: a robot computer or a learner needs
    only its own runtime. The heavy modules are made unimportable, so a hidden import fails."""
    code = (
        "import sys\n"
        "for name in ('mujoco', 'torch', 'onnxruntime', 'jax'): sys.modules[name] = None\n"
        f"import {module}\n"
    )
    if module == "q2real.safety":
        code += "from q2real.safety import Shield, ReferenceShield\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{module} ({LIGHT[module]}):\n{result.stderr[-2000:]}"
