from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from q2real.agents.registry import LEARNERS
from q2real.cli.config_reference import _BLOCK_START, page, part, preset_comment, reference
from q2real.cli.main import main
from q2real.configs.loader import list_presets

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "config.md"


def test_every_config_field_has_a_docstring() -> None:
    """A key without a docstring is a key nobody can look up: `q2real config --doc` would say nothing."""
    missing = sorted(
        {f"{entry.declared} ({entry.key})" for p in reference().parts.values() for entry in p.entries if not entry.doc}
    )
    assert not missing, "config fields without a docstring (the string literal after the field):\n" + "\n".join(missing)


def test_config_doc_prints_one_section_with_its_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--doc", "sac"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### sac\n")
    assert "`sac.init_alpha`: `float` = `0.1`\n: Initial entropy temperature." in out
    assert '`sac.critic_head`: `"scalar" | "categorical" | "quantile"` = `scalar`' in out
    assert "`sac.chunk`: section [chunk](#chunk)" in out
    assert "td3." not in out


def test_a_job_shows_what_it_changes_in_a_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--doc", "train"]) == 0
    out = capsys.readouterr().out
    assert "`env`: section [env](#env) = `{task: pendulum_swingup, num_envs: 4}`" in out
    assert "`<algo>`: the section `algo` chooses: [sac](#sac), [td3](#td3)" in out
    assert "`sampler`: section [sampler](#sampler)\n" in out


def test_an_unknown_section_exits_2_naming_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--doc", "sacc"]) == 2
    err = capsys.readouterr().err
    assert "--doc sacc: no such job, section or task" in err
    for name in ("train", "deploy", "sac", "env", "shield", "deploy.finetune", "panda_reach", "presets"):
        assert f" {name}," in err or err.rstrip().endswith(f" {name}")


def test_the_reference_covers_every_learner_and_all_its_keys() -> None:
    for algo, learner in LEARNERS.items():
        settings = learner.config
        text = part(algo)
        assert f"Chosen by `algo: {algo}` in train" in text
        for f in dataclasses.fields(settings):
            assert f"`{algo}.{f.name}`: " in text, f"{algo}.{f.name}"


def test_the_command_prints_the_documentation_page(capsys: pytest.CaptureFixture[str]) -> None:
    """One function writes both; the committed page is current (`python docs/generate.py` rewrites it)."""
    assert main(["config", "--doc"]) == 0
    assert capsys.readouterr().out == page()
    assert PAGE.read_text().endswith("\n\n" + page()), "docs/reference/config.md is stale: run docs/generate.py"


def test_every_shipped_preset_is_listed_with_its_leading_comment() -> None:
    table = part("presets")
    for name in list_presets():
        assert preset_comment(name), f"configs/presets/{name}.yaml: start it with a comment saying what it is for"
        assert f"| `{name}` |" in table


def test_wrapped_text_never_opens_a_markdown_block() -> None:
    """A continuation line that began with `-`, `>` or `1.` would end the definition it belongs to."""
    continued = [line.split()[0] for line in page().splitlines() if line.startswith("  ") and line.strip()]
    assert continued
    assert not [word for word in continued if _BLOCK_START.fullmatch(word)]
