"""Every result the benchmarks wrote is shown on a results page, and every benchmark names its page."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "bench" / "results"
SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


def docs_module(name: str) -> ModuleType:
    """docs/`name`.py, imported as `python docs/generate.py` imports it: with docs/ on the path."""
    sys.path.insert(0, str(DOCS))
    try:
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(DOCS))


@pytest.fixture(scope="module")
def pages() -> ModuleType:
    return docs_module("results_pages")


def test_every_json_in_bench_results_is_read_by_a_results_page(pages: ModuleType) -> None:
    pages.loaded.clear()
    for _source, make in pages.generators().values():
        make()
    written = {path.relative_to(RESULTS).as_posix() for path in RESULTS.rglob("*.json")}
    # Runs done in parts keep their working directories in skills/parts until they finish: not results.
    written = {name for name in written if not name.startswith("skills/parts/")}
    assert sorted(written - pages.loaded) == [], "results no page shows; add them to docs/results_pages.py"


def test_generate_imports_the_results_pages_as_docs_generate_runs(pages: ModuleType) -> None:
    # Calling generate.generators() would import what every other page is generated from; that it keeps
    # the `results` entry is held by ruff (the import would go unused), so this stays a millisecond test.
    assert docs_module("generate").results is pages.generators


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_each_benchmark_names_the_results_page_that_shows_it(script: Path, pages: ModuleType) -> None:
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    named = re.findall(r"^Results: docs/(results/[\w-]+\.md)$", doc, re.MULTILINE)
    assert len(named) == 1, f"{script.name}: its docstring names no page (`Results: docs/results/PAGE.md`)"
    assert named[0] in pages.generators(), f"{script.name}: docs/{named[0]} is not a generated page"
    assert (DOCS / named[0]).is_file(), f"docs/{named[0]}: missing; run `python docs/generate.py`"
    assert script.stem in pages.BENCH_OF, f"{script.name}: not in docs/results_pages.py's BENCHES"
    assert f"results/{pages.BENCH_OF[script.stem].page}.md" == named[0], "the results index lists it elsewhere"
