"""The config reference: every key each job takes, with its type, its default and what it does.

One function writes it for both of its readers: `docs/generate.py` commits it as the documentation page
`reference/config.md`, and `q2real config --doc [NAME]` prints it (or one part) in a terminal, so the
two never differ. Nothing is written by hand: the jobs' config dataclasses are walked from their roots,
and each field's text is its attribute docstring (the string literal after it), read from the source; a
field a subclass redeclares only to change its default keeps its base's docstring.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import re
import sys
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import yaml

from q2real.agents.config import TrainConfig
from q2real.agents.jobs import job_kind
from q2real.agents.onrobot.finetune import FinetuneConfig
from q2real.agents.rollout import RolloutConfig
from q2real.agents.stream.train import StreamTrainConfig
from q2real.configs.docstrings import class_node, field_docs
from q2real.configs.loader import ConfigError, list_presets, load, read_preset, section_fields, to_dict
from q2real.deploy_ros.settings import NodeConfig
from q2real.residual.bc import BCConfig
from q2real.residual.record import RecordConfig
from q2real.residual.train import ResidualTrainConfig
from q2real.sim import registry

WIDTH = 100
"""Characters per line of running text; a key's entry line is never broken."""


@dataclass(frozen=True)
class Job:
    """A command that resolves a root config from defaults, a preset and `key=value` overrides."""

    name: str
    config: type
    usage: str
    summary: str


JOBS = (
    Job(
        "train",
        TrainConfig,
        "`q2real train [--preset NAME] [KEY=VALUE ...]`",
        "Off-policy reinforcement learning on a task's batched envs, with the learner `algo` names.",
    ),
    Job(
        "train-residual",
        ResidualTrainConfig,
        "`q2real train [--preset NAME] residual.base=RUN_DIR [KEY=VALUE ...]`: a config with a `residual` section",
        "SAC as a bounded correction on a behaviour-cloned base policy, or from demonstrations beside its "
        "own data (RLPD): the keys of train, algo `sac` only, and `residual`.",
    ),
    Job(
        "train-stream",
        StreamTrainConfig,
        "`q2real train algo=stream_ac [KEY=VALUE ...]`",
        "Stream AC(lambda): one env, each transition learned from once as it happens, no replay.",
    ),
    Job(
        "train-bc",
        BCConfig,
        "`q2real train algo=bc dataset=DIR [KEY=VALUE ...]`",
        "Behaviour cloning of a demonstration dataset: the base policy of residual RL, or a policy on its own.",
    ),
    Job(
        "finetune",
        FinetuneConfig,
        "`q2real finetune RUN_DIR [--preset NAME] [KEY=VALUE ...]`; `q2real learn RUN_DIR --serve HOST:PORT "
        "[KEY=VALUE ...]` and deploy's `finetune.learner` take the same keys",
        "A trained run's learner continued on one robot: in simulation under `shift`'s dynamics, beside the "
        "deploy node on the robot, or on a workstation serving robots.",
    ),
    Job(
        "deploy",
        NodeConfig,
        "`q2real deploy BUNDLE [--preset NAME] [KEY=VALUE ...]`, or the node's flat ROS 2 parameters "
        "(`shield.ramp_time`)",
        "The ROS 2 node that runs a policy bundle on a robot, every command through the safety shield.",
    ),
    Job(
        "demos-record",
        RecordConfig,
        "`q2real demos record [--preset NAME] [KEY=VALUE ...]`",
        "A scripted expert or a policy bundle rolled out on a task, its episodes written as a LeRobotDataset.",
    ),
    Job(
        "rollout",
        RolloutConfig,
        "`q2real rollout [--preset NAME] [KEY=VALUE ...]`",
        "A uniform-random or zero policy rolled through a task, its returns logged: the task's floor.",
    ),
)
PRESET_JOBS = {"rl": "train", "residual": "train-residual", "stream": "train-stream", "bc": "train-bc"}
"""`agents.jobs.job_kind` -> the job a preset configures."""


@dataclass(frozen=True)
class Entry:
    """One key: as an override writes it, its type and default as YAML writes them, and its docstring."""

    key: str
    type: str
    default: str
    doc: str
    declared: str
    """`module.Class.field` where the field is first declared: where its docstring belongs."""
    sections: tuple[type, ...] = ()
    """The settings classes a section key holds: one, or one per choice."""


@dataclass
class _Section:
    """A settings class found under one or more keys: its entries are listed once, under the first."""

    cls: type
    entries: list[Entry]
    keys: dict[str, list[str]] = field(default_factory=dict)
    """Key it is written under -> the jobs that have it there."""
    chosen: list[tuple[str, str, str]] = field(default_factory=list)
    """(the choosing key, the choice, the job) for a section written under a choice's name."""
    tasks: list[str] = field(default_factory=list)
    """The tasks whose settings hold it (`env.task_params.reward_scales`)."""


@dataclass(frozen=True)
class Part:
    """What `q2real config --doc NAME` prints: a job, a section, a task's settings or the presets."""

    name: str
    lead: str
    entries: tuple[Entry, ...] = ()


class Reference:
    """Every job's keys, the sections they hold and each task's settings, walked from the configs."""

    def __init__(self) -> None:
        self.sections: dict[type, _Section] = {}
        jobs = {job.name: self._walk(job.config, job.config(), "", "", job.name) for job in JOBS}
        tasks = {}
        for task in registry.task_names():
            settings = registry.default_config(task)
            tasks[task] = self._walk(type(settings), settings, "env.task_params.", "env.task_params.", None)
            for cls in {cls for entry in tasks[task] for cls in entry.sections}:
                self.sections[cls].tasks.append(task)
        self.names = self._name_sections(jobs)
        self.parts: dict[str, Part] = {}
        for job in JOBS:
            lead = f"Set with {job.usage}.\n\n{job.summary}"
            self.parts[job.name] = Part(job.name, lead, tuple(jobs[job.name]))
        for cls, found in self.sections.items():
            self.parts[self.names[cls]] = Part(self.names[cls], self._section_lead(found), tuple(found.entries))
        for task, entries in tasks.items():
            cls = registry.TASKS[task]
            lead = f"The keys of `env.task_params` when `env.task` is `{task}`.\n\n{_module_summary(cls)}"
            self.parts[task] = Part(task, lead, tuple(entries))

    def _walk(self, cls: type, config: Any, prefix: str, nested: str, job: str | None) -> list[Entry]:
        """The entries of `config` (a `cls`) written under `prefix`; the sections it holds are registered,
        a section of a choice under `nested` (`<algo>.chunk`, whichever learner holds it)."""
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        sections = section_fields(cls)
        choosers = dict(sections.values())  # a field that chooses a section takes its choices' names
        entries = []
        for f in dataclasses.fields(cls):
            value, declared = getattr(config, f.name), _declared(cls, f.name)
            doc = docs.get(f.name, "")
            if f.name in sections:
                by, choices = sections[f.name]
                for choice, settings in choices.items():
                    self._register(settings, f"{prefix}{choice}", f"{prefix}<{by}>.", job, (f"{prefix}{by}", choice))
                kind = f"the section `{prefix}{by}` chooses:"
                entries.append(Entry(f"{prefix}<{by}>", kind, "", doc, declared, tuple(choices.values())))
            elif dataclasses.is_dataclass(value):
                key = f"{nested}{f.name}"
                self._register(type(value), key, f"{key}.", job)
                changed = _changes(to_dict(value), to_dict(type(value)()))
                default = _yaml(changed) if changed else ""
                entries.append(Entry(f"{prefix}{f.name}", "section", default, doc, declared, (type(value),)))
            else:
                kind = _one_of(choosers[f.name]) if f.name in choosers else type_name(hints[f.name])
                entries.append(Entry(f"{prefix}{f.name}", kind, _yaml(value), doc, declared))
        return entries

    def _register(
        self, cls: type, key: str, nested: str, job: str | None, chosen: tuple[str, str] | None = None
    ) -> None:
        """Note that `cls` is written under `key` in `job`, before the sections it holds, so a section
        comes before those inside it; its entries are those of its first key."""
        first = cls not in self.sections
        found = self.sections.setdefault(cls, _Section(cls, []))
        jobs = found.keys.setdefault(key, [])
        if job is not None and job not in jobs:
            jobs.append(job)
        if chosen is not None and job is not None:
            found.chosen.append((*chosen, job))
        entries = self._walk(cls, cls(), f"{key}.", nested, job)
        if first:
            found.entries = entries

    def _name_sections(self, jobs: dict[str, list[Entry]]) -> dict[type, str]:
        """Each section's name: the last part of its first key, or `job.key` where a job or an earlier
        section has that name (deploy's `finetune` beside the finetune job)."""
        taken = set(jobs) | set(registry.task_names()) | {"presets"}
        names = {}
        for cls, found in self.sections.items():
            key, users = next(iter(found.keys.items()))
            name = key.split(".")[-1]
            if found.tasks and not users:
                # Every task's own settings class under the one key: named after its (first) task.
                name = f"{found.tasks[0]}.{name}"
            elif name in taken:
                name = f"{users[0]}.{key}" if users else key
            taken.add(name)
            names[cls] = name
        return names

    def _section_lead(self, found: _Section) -> str:
        if found.chosen:
            where = _join(sorted({job for _, _, job in found.chosen}, key=_job_order))
            choosing = _join(sorted({f"`{by}: {choice}`" for by, choice, _ in found.chosen}))
            keys = _join(f"`{key}`" for key in found.keys)
            lines = [f"Chosen by {choosing} in {where}: its keys are written under {keys}."]
        else:
            tasks = f" of the task{'s' if len(found.tasks) > 1 else ''} " + _join(f"`{t}`" for t in found.tasks)
            lines = [
                "Written under "
                + _join(f"`{key}`" + (f" ({_join(jobs)})" if jobs else "") for key, jobs in found.keys.items())
                + (tasks if found.tasks else "")
                + "."
            ]
        summary = _class_summary(found.cls)
        return "\n\n".join([*lines, summary] if summary else lines)

    def link(self, cls: type) -> str:
        name = self.names[cls]
        return f"[{name}](#{_slug(name)})"

    def render(self, part: Part) -> str:
        """A part as Markdown: its heading, lead paragraphs and one definition per key."""
        out = [f"### {part.name}", ""]
        for paragraph in part.lead.split("\n\n"):
            out += [*_wrap(paragraph), ""]
        for entry in part.entries:
            if entry.sections:
                term = f"`{entry.key}`: {entry.type} " + ", ".join(self.link(cls) for cls in entry.sections)
                term += f" = `{entry.default}`" if entry.default else ""
            else:
                term = f"`{entry.key}`: `{entry.type}` = `{entry.default}`"
            lines = _wrap(entry.doc or "(undocumented)", WIDTH - 2)
            out += [term, f": {lines[0]}", *(f"  {line}" for line in lines[1:]), ""]
        return "\n".join(out)


def _job_order(name: str) -> int:
    return [job.name for job in JOBS].index(name)


@functools.cache
def reference() -> Reference:
    return Reference()


def part_names() -> list[str]:
    """What `q2real config --doc` takes: every job, section and task, and `presets`."""
    return [*reference().parts, "presets"]


def part(name: str) -> str:
    """One part of the reference as Markdown; a ConfigError that names the parts for an unknown name."""
    ref = reference()
    if name == "presets":
        return presets_table()
    if name not in ref.parts:
        raise ConfigError(f"--doc {name}: no such job, section or task; one of: {', '.join(part_names())}")
    return ref.render(ref.parts[name])


def page() -> str:
    """The whole reference, as docs/reference/config.md holds it and `q2real config --doc` prints it."""
    ref = reference()
    jobs = {job.name for job in JOBS}
    tasks = set(registry.task_names())
    intro = (
        "Every job resolves its settings in three layers: the defaults listed here, then a preset "
        "(`--preset NAME`: a shipped one from the table below, or any YAML file), then `key.sub=value` "
        "overrides on the command line; `--print-config` shows the result, and a wrong key or type is "
        "refused naming the layer it came from. Each key is given as an override writes it, with its type "
        "and its default as YAML writes them; a section's default lists only what that job changes from the "
        "section's own defaults. `q2real config --doc NAME` prints one part of this page: a job, a section, "
        "a task or `presets`."
    )
    task_intro = (
        "`env.task_params` holds the settings of the task `env.task` names (`q2real envs --task NAME` "
        "prints them); an adapter's env (`gymnasium:`, `playground:`, `robosuite:`) takes its own keyword "
        "arguments there instead."
    )
    out = ["# Config reference", "", *_wrap(intro), "", "## Presets", "", presets_table(), "## Jobs", ""]
    out += [ref.render(p) for name, p in ref.parts.items() if name in jobs]
    out += ["## Sections", ""]
    out += [ref.render(p) for name, p in ref.parts.items() if name not in jobs and name not in tasks]
    out += ["## Tasks", "", *_wrap(task_intro), ""]
    out += [ref.render(p) for name, p in ref.parts.items() if name in tasks]
    return "\n".join(out).rstrip("\n") + "\n"


def presets_table() -> str:
    """The shipped presets: name, the job they configure, algo, task and their leading comment's first
    sentence."""
    rows = ["| preset | job | algo | task | description |", "| --- | --- | --- | --- | --- |"]
    jobs = {job.name: job for job in JOBS}
    for name in list_presets():
        job = jobs[PRESET_JOBS[job_kind(name, [])]]
        config = load(job.config, name)
        cells = [f"`{name}`", f"[{job.name}](#{_slug(job.name)})", f"`{config.algo}`", f"`{config.env.task}`"]
        cells.append(_first_sentence(preset_comment(name)))
        rows.append("| " + " | ".join(cell.replace("|", r"\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def preset_comment(name: str) -> str:
    """The comment lines a preset file starts with, as one line of text."""
    path, _ = read_preset(name)
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(" ".join(lines).split())


def _first_sentence(text: str) -> str:
    """Up to the first `.`, `:` or `;` that ends a clause outside parentheses."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ".:;" and text[i + 1 : i + 2] in ("", " "):
            return text[:i]
    return text


def _declared(cls: type, name: str) -> str:
    """`module.Class.name` of the class among `cls`'s bases that first declares field `name`."""
    declaring = next(base for base in reversed(cls.__mro__) if name in vars(base).get("__annotations__", {}))
    return f"{declaring.__module__}.{declaring.__qualname__}.{name}"


def _class_summary(cls: type) -> str:
    """A settings class's own docstring; without one, the first paragraph of its module's."""
    own = ast.get_docstring(class_node(cls))
    return _paragraphs(own) if own else _module_summary(cls)


def _module_summary(cls: type) -> str:
    return _paragraphs((sys.modules[cls.__module__].__doc__ or "").strip().split("\n\n")[0])


def _paragraphs(text: str) -> str:
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def type_name(tp: Any) -> str:
    """A field type as a config file spells its values: `float`, `int | None`, `"hold" | "damp"`,
    `list[int]` for a tuple of any length, `[float, float]` for a fixed one."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "None"
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in sorted(args, key=lambda arg: arg is type(None)))
    if origin is Literal:
        return _one_of(args)
    if origin in (tuple, list):
        if origin is tuple and not (args and args[-1] is Ellipsis):
            return "[" + ", ".join(type_name(arg) for arg in args) + "]"
        return f"list[{type_name(args[0]) if args else 'any'}]"
    if origin is dict or tp is dict:
        return "mapping"
    if tp is Any:
        return "any"
    return tp.__name__


def _one_of(values: Iterable[Any]) -> str:
    """The values a field may take, as a config file spells them: `"hold" | "damp"`."""
    return " | ".join(f'"{value}"' if isinstance(value, str) else str(value) for value in values)


def _yaml(value: Any) -> str:
    """`value` in YAML's flow style, as a preset or an override writes it (a tuple as a list)."""
    text = yaml.safe_dump(_plain(value), default_flow_style=True, sort_keys=False, width=math.inf)
    return text.removesuffix("\n...\n").strip()


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _changes(value: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """The entries of `value` that differ from `default`'s, nested mappings compared key by key."""
    out = {}
    for key, item in value.items():
        base = default.get(key)
        if isinstance(item, dict) and isinstance(base, dict):
            nested = _changes(item, base)
            if nested:
                out[key] = nested
        elif item != base:
            out[key] = item
    return out


def _join(items: Any) -> str:
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _slug(heading: str) -> str:
    """The anchor MyST gives a heading (`myst_heading_anchors`): lower case, spaces as dashes, only word
    characters and dashes kept."""
    return re.sub(r"[^\w\- ]", "", heading.lower().replace(" ", "-"))


_BLOCK_START = re.compile(r"[-+*:=]|#{1,6}|\d{1,9}[.)]|>.*|[-=_*]{2,}|`{3,}.*|~{3,}.*")
"""A word that, starting a line, Markdown could read as a new block (a list item, a quote, a heading, a
rule, a fence, a definition) rather than the paragraph's next line."""


_WORD = re.compile(r"(?:`[^`]*`|[^\s`]|`)+")
"""A word to wrap at: a code span with spaces in it stays whole, as it reads in a terminal."""


def _wrap(text: str, width: int = WIDTH) -> list[str]:
    """Greedy word wrap; a word that would start a line and open a block stays on the line before."""
    lines: list[str] = []
    for word in _WORD.findall(text):
        if lines and (len(lines[-1]) + 1 + len(word) <= width or _BLOCK_START.fullmatch(word)):
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]
