"""Typed configs: dataclass defaults, then a YAML preset, then `key.sub=value` overrides.

Every layer is checked against the dataclass field types as it is applied, so an unknown key or a
wrong type is reported with the layer it came from (`configs/presets/x.yaml: sac.lr: ...` or
`command line: env.num_envs: ...`) instead of surfacing as a crash deep inside training.

A *section* field (`section()`) holds the settings of one of several alternatives, chosen by another
field: `algo: td3` and a `td3:` section. Files and overrides name the section by its choice, only the
chosen one exists, and choosing another starts that one's section from its defaults, so a resolved
config carries no settings of alternatives the run does not use.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from q2real.configs.errors import Q2RealError

PRESET_DIR = Path(__file__).resolve().parent / "presets"
T = TypeVar("T")


class ConfigError(Q2RealError, ValueError):
    """A config key is unknown or its value has the wrong type; the message names key and source."""


_SECTION = "q2real_section"


def section(by: str, choices: Mapping[str, type], default: str) -> Any:
    """A dataclass field holding the settings of the choice that field `by` names, written under that
    choice's name (`choices` maps each name to its settings class). `by` may take exactly the names of
    `choices`, which is kept, not copied, so a registry's later entries are choices too."""
    return dataclasses.field(default_factory=choices[default], metadata={_SECTION: (by, choices)})


def section_fields(config: Any) -> dict[str, tuple[str, Mapping[str, type]]]:
    """Section field name -> (the field that chooses it, its choices), of a config or its class."""
    return {f.name: f.metadata[_SECTION] for f in dataclasses.fields(config) if _SECTION in f.metadata}


def section_name(config: Any, field_name: str) -> str:
    """The key a section field is written under: the current value of the field that chooses it."""
    return getattr(config, section_fields(config)[field_name][0])


def _coerce(value: Any, tp: Any, source: str, key: str) -> Any:
    where = f"{source}: {key}"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, source, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return merge(tp(), value, source, prefix=f"{key}.")
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, a, source, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
        item = args[0] if args else Any
        items = [_coerce(v, item, source, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            # YAML 1.1 reads `5e-4` (no dot) as a string; people write learning rates that way.
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r:.80}")
        try:
            return float(value)
        except OverflowError:
            raise ConfigError(f"{where}: expected a number, got an integer too large for a float") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"{where}: config fields of type {tp} are not supported")


def merge(config: T, data: Mapping[str, Any], source: str, prefix: str = "") -> T:  # T: a dataclass instance
    """A copy of `config` with the keys in `data` applied; unknown keys and bad types raise ConfigError."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(type(config))
    sections = section_fields(config)
    changes: dict[str, Any] = {}
    # A choosing field goes first, whatever its place in `data`: it decides which section keys exist.
    for name, (by, choices) in sections.items():
        if by in data:
            chosen = _coerce(data[by], hints[by], source, f"{prefix}{by}")
            if chosen not in choices:
                raise ConfigError(f"{source}: {prefix}{by}: expected one of {list(choices)}, got {chosen!r}")
            changes[by] = chosen
            if chosen != getattr(config, by):
                changes[name] = choices[chosen]()
    public = {f.name for f in dataclasses.fields(config)} - set(sections)  # pyright: ignore[reportArgumentType]
    keys = public | {choice for _, choices in sections.values() for choice in choices}
    for key, value in data.items():
        where = f"{source}: {prefix}{key}"
        if key in changes and key in public:
            continue
        if key not in keys:
            raise ConfigError(f"{where}: unknown key; {type(config).__name__} has {sorted(keys)}")
        owner = next((name for name, (_, choices) in sections.items() if key in choices), None)
        if owner is not None:
            by = sections[owner][0]
            chosen = changes.get(by, getattr(config, by))
            if key != chosen:
                raise ConfigError(
                    f"{where}: settings of {by} '{key}', but {by} is '{chosen}'; set {prefix}{by}={key} to use them"
                )
            changes[owner] = merge(changes.get(owner, getattr(config, owner)), value, source, prefix=f"{prefix}{key}.")
            continue
        current = getattr(config, key)
        if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
            changes[key] = merge(current, value, source, prefix=f"{prefix}{key}.")
        elif isinstance(current, Mapping) and isinstance(value, Mapping):
            # A free-form mapping (`env.task_params`): `a.b=1` on the command line sets one entry on top
            # of the preset's, as it does in a section, rather than replacing all of them.
            changes[key] = _coerce(_layered(current, value), hints[key], source, f"{prefix}{key}")
        else:
            changes[key] = _coerce(value, hints[key], source, f"{prefix}{key}")
    return dataclasses.replace(config, **changes)  # pyright: ignore[reportArgumentType]


def _layered(below: Mapping[str, Any], above: Mapping[str, Any]) -> dict[str, Any]:
    """`above`'s entries over `below`'s, nested mappings layered the same way."""
    out = dict(below)
    for key, value in above.items():
        inner = out.get(key)
        both = isinstance(inner, Mapping) and isinstance(value, Mapping)
        out[key] = _layered(inner, value) if both else value  # pyright: ignore[reportArgumentType]
    return out


def parse_overrides(overrides: list[str], source: str = "command line") -> dict[str, Any]:
    """Turn `a.b=1 c=[1,2]` into a nested dict; values are parsed as YAML scalars/lists."""
    nested: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: '{item}': expected key=value (e.g. env.num_envs=128)")
        key, raw = item.split("=", 1)
        if not key:
            raise ConfigError(f"{source}: '{item}': empty key")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"{source}: {key}: cannot parse value {raw!r}: {err}") from err
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: {key}: '{part}' is set both as a value and as a section")
        node[parts[-1]] = value
    return nested


def preset_path(name: str) -> Path:
    """A preset by name (`configs/presets/<name>.yaml`) or by file path."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    shipped = PRESET_DIR / f"{name}.yaml"
    if shipped.is_file():
        return shipped
    raise ConfigError(f"preset '{name}': no such file and no shipped preset; shipped: {list_presets()}")


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def read_preset(preset: str) -> tuple[Path, Any]:
    """A preset's (or YAML file's) path and parsed contents ({} for an empty file)."""
    path = preset_path(preset)
    try:
        return path, yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err


def load(cls: type[T], preset: str | None = None, overrides: list[str] | None = None) -> T:
    """Resolve a config: `cls()` defaults, then the preset YAML, then command-line overrides; then its
    `validate()` range checks, so a value no run can use is refused before anything starts.

    A class with an `upgrade(data, source)` classmethod gets each file's data through it first, to
    read files an older q2real wrote."""
    config = cls()
    sources = ["defaults"]
    if preset is not None:
        path, data = read_preset(preset)
        upgrade = getattr(cls, "upgrade", None)
        if upgrade is not None and isinstance(data, Mapping):
            data = upgrade(data, str(path))
        config = merge(config, data, str(path))
        sources.append(str(path))
    if overrides:
        config = merge(config, parse_overrides(overrides), "command line")
        sources.append("command line")
    return validated(config, " + ".join(sources))


def validated(config: T, source: str) -> T:
    """`config` after its `validate()` (if it has one), with a failure reported as a ConfigError."""
    validate = getattr(config, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as err:
            raise ConfigError(f"{source}: {err}") from None
    return config


def to_dict(config: Any) -> dict[str, Any]:
    """Plain dict (tuples as lists, sections under their choice's name) for YAML/JSON; `load` reads it
    back to an equal config."""
    return _plain(config)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        sections = section_fields(value)
        return {
            (section_name(value, f.name) if f.name in sections else f.name): _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
        }
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
