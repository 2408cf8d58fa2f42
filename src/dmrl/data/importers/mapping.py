"""Which source key feeds which dmrl modality (flags or a small YAML), checked against the keys a dataset has.

A source dataset names its own keys (LeRobot: ``observation.images.front``, ``observation.state``, ``action``;
robomimic: ``agentview_image``, ``robot0_joint_pos``, ``actions``). A :class:`KeyMap` says which of them become
dmrl's ``rgb`` (several cameras stack along channels), ``joints``, ``force`` and ``state`` (several vector keys
concatenate), actions, rewards and the done flag. Empty fields take the format's defaults; ``none`` drops a modality.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

#: The vector modalities a mapping may fill (each from one or more source keys, concatenated).
VECTOR_FIELDS = ("joints", "force", "state")
#: Write ``--rgb none`` (or ``joints: none`` in YAML) to leave a modality out even where a default would fill it.
NONE = "none"


@dataclass(frozen=True)
class KeyMap:
    """Source keys per dmrl field. () / "" mean "the format's default"; ("none",) means "leave it out"."""

    rgb: tuple[str, ...] = ()
    """Camera keys whose frames become rgb (3 channels each, stacked in this order)."""
    joints: tuple[str, ...] = ()
    """Vector keys concatenated into joints (the robot's proprioception)."""
    force: tuple[str, ...] = ()
    """Vector keys concatenated into force."""
    state: tuple[str, ...] = ()
    """Vector keys concatenated into state (privileged: a deployable policy never reads it)."""
    action: str = ""
    """The action key."""
    reward: str = ""
    """The per-step reward key ("none": zeros)."""
    done: str = ""
    """The per-step done flag key; its last value of an episode is stored as terminated ("none": truncated)."""

    def with_defaults(self, defaults: KeyMap) -> KeyMap:
        """Each empty field replaced by the format's default; "none" fields emptied."""
        out: dict[str, Any] = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(defaults, f.name)
            value = mine if mine else theirs
            if value == NONE or value == (NONE,):
                value = () if isinstance(value, tuple) else ""
            out[f.name] = value
        return replace(self, **out)

    def to_json(self) -> dict[str, Any]:
        """The mapping as stored in the store's ``import`` attr (lists and strings only)."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


def load_mapping(path: Path) -> KeyMap:
    """A KeyMap from a YAML file of the same keys (a string or a list for the tuple fields); one-line errors."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--mapping {path}: no such file (a YAML with keys {', '.join(_FIELDS)})")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"--mapping {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"--mapping {path}: top level must be a mapping with keys {', '.join(_FIELDS)}")
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise ValueError(f"--mapping {path}: unknown key {unknown[0]!r}; allowed: {', '.join(_FIELDS)}")
    out: dict[str, Any] = {}
    for name, value in doc.items():
        tuple_field = isinstance(getattr(KeyMap(), name), tuple)
        if value is None:
            value = NONE
        if tuple_field:
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
                raise ValueError(f"--mapping {path}: key {name!r} must be a key name or a list of them, got {value!r}")
            out[name] = tuple(items)
        else:
            if not isinstance(value, str):
                raise ValueError(f"--mapping {path}: key {name!r} must be one key name, got {value!r}")
            out[name] = value
    return KeyMap(**out)


def merge_flags(from_yaml: KeyMap, flags: KeyMap) -> KeyMap:
    """Flags override the YAML field by field (a flag left at its default keeps the YAML's value)."""
    return replace(from_yaml, **{f.name: getattr(flags, f.name) for f in fields(flags) if getattr(flags, f.name)})


def require_keys(where: str, flag: str, wanted: tuple[str, ...] | str, have: list[str]) -> None:
    """One-line ValueError naming the first missing key, the flag that asked for it and the keys that exist."""
    for key in (wanted,) if isinstance(wanted, str) else wanted:
        if key and key not in have:
            raise ValueError(f"{flag}: key {key!r} is not in {where}; it has: {', '.join(have) or 'nothing'}")


def flag_of(name: str) -> str:
    """The command-line flag of a KeyMap field (--joints)."""
    return "--" + name.replace("_", "-")


_FIELDS = tuple(f.name for f in fields(KeyMap))
