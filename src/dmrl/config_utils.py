"""Strict dict <-> dataclass conversion, YAML presets and nested overrides (no eval, no _target_; no dmrl imports).

A field made with :func:`choice` holds one of several config classes, chosen by name (a tagged union, as
lerobot's ``--policy.type``): in dicts and YAML it reads ``{"type": name, ...fields}`` (or just the name), on the
command line ``--FIELD.type NAME``, and :func:`cli_type` narrows a generic config class to the chosen classes so a
parser sees (and its help lists) only their fields.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def choice(registry: Mapping[str, type], default: str) -> Any:
    """A dataclass field holding an instance of one of ``registry``'s classes (name -> config class)."""
    return dataclasses.field(default_factory=registry[default], metadata={"choices": registry})


def choices(cls: Any) -> dict[str, Mapping[str, type]]:
    """{field name: registry} of the :func:`choice` fields of dataclass ``cls`` (a class or an instance)."""
    return {f.name: f.metadata["choices"] for f in dataclasses.fields(cls) if "choices" in f.metadata}


def type_name(value: Any, registry: Mapping[str, type]) -> str:
    """The registry name of a choice field's value."""
    return next(name for name, c in registry.items() if type(value) is c)


def _choose(registry: Mapping[str, type], current: Any, value: Any, where: str) -> Any:
    """A choice field's new value: ``value`` is a name or {"type": name, ...}; same type: ``current`` updated."""
    if isinstance(value, str):
        value = {"type": value}
    if dataclasses.is_dataclass(value) and type(value) in registry.values():
        return value
    if not isinstance(value, dict):
        raise ValueError(f"config {where}: expected a type name or a mapping with 'type', got {value!r}")
    fields = dict(value)
    name = fields.pop("type", None) or (type_name(current, registry) if current is not None else None)
    if name not in registry:
        raise ValueError(f"config key '{where}.type': got {name!r}; allowed: {', '.join(registry)}")
    if current is not None and type(current) is registry[name]:
        return merge(current, fields, where)
    return from_dict(registry[name], fields, where)


def cli_type(cls: type, cfg: Any) -> Any:
    """The type a CLI parser should see for ``cfg`` (an instance of ``cls``): a generic ``cls`` whose type parameters
    annotate fields (choice fields, or dataclasses that hold one) is specialised to what ``cfg`` holds there."""
    params = getattr(cls, "__parameters__", ())
    if not params:
        return cls
    hints = typing.get_type_hints(cls)
    by_param = {
        hint: cli_type(type(getattr(cfg, name)), getattr(cfg, name))
        for name, hint in hints.items()
        if isinstance(hint, TypeVar)
    }
    return cls[tuple(by_param[p] for p in params)]


def pop_type_flags(cfg: T, argv: list[str]) -> tuple[T, list[str]]:
    """Apply and remove the ``--FIELD.type NAME`` / ``--FIELD.type=NAME`` flags of ``cfg``'s choice fields, nested
    ones too (``--chunk.encoder.type multimodal``); -> (updated cfg, the other flags).

    The updated cfg is a default for the parser, not validated as a whole: a check that involves other fields
    (e.g. observation keys a multimodal encoder can read) runs when the parser builds the final config with the
    other flags applied."""
    rest = list(argv)
    return _pop_types(cfg, rest, ""), rest


def _pop_flag(rest: list[str], flag: str) -> str | None:
    for i, a in enumerate(rest):
        if a == flag:
            if i + 1 >= len(rest):
                raise ValueError(f"{flag} needs a value")
            value = rest[i + 1]
            del rest[i : i + 2]
            return value
        if a.startswith(flag + "="):
            del rest[i]
            return a.split("=", 1)[1]
    return None


def _pop_types(cfg: Any, rest: list[str], prefix: str) -> Any:
    """``cfg`` with the chosen types of its (nested) choice fields; a shallow copy where one changed."""
    changed: dict[str, Any] = {}
    tagged = choices(cfg)
    for f in dataclasses.fields(cfg):
        value = new = getattr(cfg, f.name)
        key = f"{prefix}{f.name.replace('_', '-')}"
        if f.name in tagged and (name := _pop_flag(rest, f"--{key}.type")) is not None:
            new = _choose(tagged[f.name], value, {"type": name}, key)
        if dataclasses.is_dataclass(new):
            new = _pop_types(new, rest, f"{key}.")
        if new is not value:
            changed[f.name] = new
    if not changed:
        return cfg
    out = copy.copy(cfg)
    for name, value in changed.items():
        object.__setattr__(out, name, value)  # not cfg's __init__: its checks run on the parser's final config
    return out


def to_dict(cfg: Any) -> Any:
    """Dataclass -> JSON-able nested dict (Paths and tuples become str and lists; choice fields get "type")."""
    if dataclasses.is_dataclass(cfg):
        out = {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
        for name, registry in choices(cfg).items():
            out[name] = {"type": type_name(getattr(cfg, name), registry), **out[name]}
        return out
    if isinstance(cfg, Path):
        return str(cfg)
    if isinstance(cfg, tuple | list):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from a nested dict; unknown keys are a one-line error naming the dotted key."""
    if not isinstance(data, dict):
        raise ValueError(f"config {where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise ValueError(f"config key {key!r} unknown; allowed here: {', '.join(sorted(fields))}")
    kwargs = {}
    tagged = choices(cls)
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        if name in tagged:
            kwargs[name] = _choose(tagged[name], fields[name].default_factory(), value, key)
        elif isinstance(hints[name], TypeVar) and fields[name].default_factory is not dataclasses.MISSING:
            # a generic field (e.g. TrainConfig.chunk: C) is read as the class its default is made of
            kwargs[name] = _convert(type(fields[name].default_factory()), value, key)
        else:
            kwargs[name] = _convert(hints[name], value, key)
    return cls(**kwargs)


def merge(cfg: T, overrides: dict[str, Any], where: str = "") -> T:
    """A copy of dataclass ``cfg`` with nested ``overrides`` applied (same strictness as :func:`from_dict`)."""
    base = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
    hints = typing.get_type_hints(type(cfg))
    tagged = choices(cfg)
    for name, value in overrides.items():
        key = f"{where}.{name}" if where else name
        if name not in base:
            raise ValueError(f"config key {key!r} unknown; allowed here: {', '.join(sorted(base))}")
        if name in tagged:
            base[name] = _choose(tagged[name], base[name], value, key)
        elif dataclasses.is_dataclass(base[name]) and isinstance(value, dict):
            base[name] = merge(base[name], value, key)
        else:
            base[name] = _convert(hints[name], value, key)
    return type(cfg)(**base)


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML preset as a dict; a missing or malformed file is a one-line error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config preset {path} not found (presets live in configs/)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"config preset {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"config preset {path}: top level must be a mapping of config keys")
    return data


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return value if dataclasses.is_dataclass(value) else from_dict(hint, value, where)
    if hint is Path:
        return Path(value)
    if origin is tuple and isinstance(value, list | tuple):
        return tuple(value)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or len(args) != 1:
            return value
        return _convert(args[0], value, where)
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ValueError(f"config key {where!r}: expected {hint.__name__}, got {value!r}")
    return value
