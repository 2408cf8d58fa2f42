"""Strict dict <-> dataclass conversion, YAML presets and nested overrides (no eval, no _target_; no dmrl imports)."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def to_dict(cfg: Any) -> Any:
    """Dataclass -> JSON-able nested dict (Paths and tuples become str and lists)."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
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
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, f"{where}.{name}" if where else name)
    return cls(**kwargs)


def merge(cfg: T, overrides: dict[str, Any], where: str = "") -> T:
    """A copy of dataclass ``cfg`` with nested ``overrides`` applied (same strictness as :func:`from_dict`)."""
    base = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
    hints = typing.get_type_hints(type(cfg))
    for name, value in overrides.items():
        key = f"{where}.{name}" if where else name
        if name not in base:
            raise ValueError(f"config key {key!r} unknown; allowed here: {', '.join(sorted(base))}")
        if dataclasses.is_dataclass(base[name]) and isinstance(value, dict):
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
