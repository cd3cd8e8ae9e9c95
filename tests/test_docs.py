"""The documentation: generated pages current, the bundle reference complete, the README short with links that
resolve, and the site building strictly (a broken link, a missing page or image fails it)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from q2real.contracts.schema import FIELDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_LINES = 300
"""The README is the front door: what q2real is, install, the quick start, the path to a robot, where the
docs are, the test command. Everything else is in the docs."""


def _generate():
    sys.path.insert(0, str(DOCS))  # generate.py runs as a script, its helpers beside it
    try:
        spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(DOCS))


def test_every_generated_page_is_current() -> None:
    generate = _generate()
    texts = generate.pages()
    assert {"reference/config.md", "reference/cli.md", "reference/bundle.md", "reference/ros.md"} <= set(texts)
    assert generate.stale(texts) == [], "stale: run `python docs/generate.py`"


def _leaf_paths(value, path: str = "") -> set[str]:
    """Every field path of a metadata document as FIELDS writes them: list items as `[]`; a source, the
    figures and the training config are one field each (they are documented as wholes)."""
    if path in ("training.config", "figures") or path.endswith(".source"):
        return {path}
    if isinstance(value, dict) and value:
        return {path} | {p for k, v in value.items() for p in _leaf_paths(v, f"{path}.{k}" if path else k)}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return {path} | {p for v in value for p in _leaf_paths(v, f"{path}[]")}
    return {path}


def test_the_bundle_reference_lists_every_field_a_bundle_carries() -> None:
    bundles = [p for p in ROOT.glob("**/*.onnx.json") if not any(part.startswith(".") for part in p.parts)]
    assert len(bundles) >= 5
    found = set().union(*(_leaf_paths(json.loads(p.read_text())) for p in bundles)) - {""}
    assert found - set(FIELDS) == set(), "fields exported but not in contracts.schema.FIELDS"


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) + re.findall(r'src="([^"]+)"', text)
    local = [t for t in targets if "://" not in t and not t.startswith("mailto:")]
    assert local, "the README links the docs"
    assert [t for t in local if not (ROOT / t).exists()] == []


@pytest.mark.slow  # Sphinx reads and writes every page
@pytest.mark.timeout(600)
def test_the_documentation_site_builds_strictly(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html", str(DOCS), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-5000:]
    assert (tmp_path / "index.html").is_file() and (tmp_path / "reference" / "config.html").is_file()
