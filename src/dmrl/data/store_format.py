"""The episode store's on-disk format: its columns, root attributes, array layout, and what an episode must match.

On-disk layout (zarr v3, local directory; N = committed steps, E = committed episodes)::

    <path>/zarr.json            group attrs: dmrl_format_version=1, env_id, obs_modes, action_meaning,
                                action_dim, obs_spec {mode: {"shape": [...], "dtype": "uint8"}}, + extra_attrs
    data/obs/<mode>             (N, ...)  per-step observation, one array per mode in ARRAY_MODES
    data/actions                (N, Da) float32
    data/rewards                (N,) float32
    data/terminals              (N,) bool, only where attr terminals=true (create(terminals=True)): a per-step
                                terminal for TD backups in a recording that goes on past it (Episode.terminals)
    final/<mode>                (E, ...)  observation after each episode's last action
    meta/success|terminated|truncated (E,) bool · meta/return (E,) float32 · meta/seed (E,) int64
    meta/<text>/utf8, /ends     ragged UTF-8 strings, text in (instruction, info as JSON)
    meta/<task key>             the task's own per-episode values (attr episode_info, see types.InfoField): a
                                categorical one as (E,) int8 codes, a text one as ragged UTF-8 like the above.
                                A store without the attr is MultiPath's: route (int8 code into ROUTES), target.
    meta/episode_ends           (E,) int64 cumulative end step, fill -1; written LAST = the commit

How the commit works (episode_ends last, readers trust its valid prefix): dmrl.data.episodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zarr

from dmrl.data._zarr_utils import CORRUPT_HINT, StoreError, episode_chunks, step_chunks
from dmrl.types import ARRAY_MODES, ROUTES, Episode, InfoField, parse_obs_modes

FORMAT_VERSION = 1
#: Per-episode numeric columns and their stored dtypes (besides `episode_ends`).
META_COLUMNS: dict[str, str] = {
    "success": "bool",
    "return": "float32",
    "seed": "int64",
    "terminated": "bool",
    "truncated": "bool",
}
#: Per-episode strings. Stored as ragged UTF-8 (a uint8 byte array + int64 end offsets) rather than zarr's
#: string dtype: plain numeric arrays are core zarr v3, behave the same on numpy 1.26 and 2.x, and take
#: part in the same resize/truncate commit logic as every other column.
TEXT_COLUMNS: tuple[str, ...] = ("instruction", "info")
RESERVED_ATTRS = ("dmrl_format_version", "env_id", "obs_modes", "action_meaning", "action_dim", "obs_spec")
#: Attributes of optional parts; a store without them (written before they existed) has none of those parts.
OPTIONAL_ATTRS = ("episode_info", "terminals")
#: The task columns of a store written before task metadata existed (all of them MultiPath's); also the default
#: of `create`, so that callers written before then keep writing the same layout.
LEGACY_EPISODE_INFO: dict[str, InfoField] = {"route": InfoField(categories=ROUTES), "target": InfoField()}

ObsSpec = dict[str, tuple[tuple[int, ...], str]]


# ---------------------------------------------------------------------- a new store
def new_store_attrs(
    *,
    env_id: str,
    obs_modes: tuple[str, ...] | list[str],
    action_meaning: list[str],
    obs_spec: ObsSpec,
    action_dim: int,
    extra_attrs: dict[str, Any] | None,
    episode_info: dict[str, InfoField] | None,
    terminals: bool,
) -> tuple[dict[str, Any], dict[str, InfoField]]:
    """`EpisodeStore.create`'s arguments checked (one-line ValueError) and turned into the new store's root group
    attributes; returns (attributes, task columns), the latter LEGACY_EPISODE_INFO for ``episode_info=None``."""
    info_spec = dict(LEGACY_EPISODE_INFO if episode_info is None else episode_info)
    taken = sorted(set(info_spec) & {*META_COLUMNS, *TEXT_COLUMNS, "episode_ends"})
    if taken:
        raise ValueError(f"episode_info: keys {taken} clash with the store's own columns; rename them")
    modes = parse_obs_modes(obs_modes)
    array_modes = [m for m in modes if m in ARRAY_MODES]
    if sorted(obs_spec) != sorted(array_modes):
        raise ValueError(f"obs_spec keys {sorted(obs_spec)} must equal the array obs_modes {array_modes}")
    for m, (_, dtype) in obs_spec.items():  # checked before an --overwrite deletes the old store
        try:
            np.dtype(dtype)
        except TypeError:
            raise ValueError(f"obs_spec[{m!r}]: dtype {dtype!r} is not a numpy dtype (e.g. 'float32')") from None
    if len(action_meaning) != action_dim:
        raise ValueError(f"action_meaning has {len(action_meaning)} names but action_dim is {action_dim}")
    clash = sorted(set(extra_attrs or {}) & {*RESERVED_ATTRS, *OPTIONAL_ATTRS})
    if clash:
        raise ValueError(f"extra_attrs may not redefine reserved store attributes {clash}")
    attrs = {
        "dmrl_format_version": FORMAT_VERSION,
        "env_id": env_id,
        "obs_modes": list(modes),
        "action_meaning": list(action_meaning),
        "action_dim": int(action_dim),
        "obs_spec": {m: {"shape": list(obs_spec[m][0]), "dtype": np.dtype(obs_spec[m][1]).name} for m in array_modes},
        "episode_info": {k: f.to_json() for k, f in info_spec.items()},
        **({"terminals": True} if terminals else {}),
        **(extra_attrs or {}),
    }
    return attrs, info_spec


def create_arrays(
    root: zarr.Group, obs_spec: ObsSpec, info_spec: dict[str, InfoField], *, action_dim: int, terminals: bool
) -> None:
    """Create every (empty) array of a new store under `root`, as laid out in the module docstring; `obs_spec`
    holds exactly the store's array modalities (`new_store_attrs` makes sure)."""

    def new(name: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: str, fill: Any = 0) -> None:
        root.create_array(name, shape=shape, chunks=chunks, dtype=dtype, fill_value=fill)

    for m in obs_spec:
        shape, dtype = tuple(obs_spec[m][0]), np.dtype(obs_spec[m][1]).name
        new(f"data/obs/{m}", (0, *shape), step_chunks(shape, dtype), dtype)
        new(f"final/{m}", (0, *shape), episode_chunks(shape, dtype), dtype)
    new("data/actions", (0, action_dim), step_chunks((action_dim,), "float32"), "float32")
    new("data/rewards", (0,), step_chunks((), "float32"), "float32")
    if terminals:
        new("data/terminals", (0,), step_chunks((), "bool"), "bool", fill=False)
    categorical = [k for k, f in info_spec.items() if f.categories is not None]
    for name, dtype in {**META_COLUMNS, **dict.fromkeys(categorical, "int8")}.items():
        new(f"meta/{name}", (0,), episode_chunks((), dtype), dtype)
    for name in (*TEXT_COLUMNS, *(k for k in info_spec if k not in categorical)):
        new(f"meta/{name}/utf8", (0,), (1 << 16,), "uint8")
        new(f"meta/{name}/ends", (0,), episode_chunks((), "int64"), "int64", fill=-1)
    # The -1 fill is what makes an entry whose chunk never got written read as "not committed".
    new("meta/episode_ends", (0,), episode_chunks((), "int64"), "int64", fill=-1)


# ---------------------------------------------------------------------- an existing store
def parse_attrs(path: Path, attrs: dict[str, Any]) -> dict[str, Any]:
    """The root attributes, checked (one-line StoreError for a missing/corrupt one or another format version)."""
    for key in RESERVED_ATTRS:
        if key not in attrs:
            raise StoreError(f"dmrl store {path}: missing attribute {key!r}; {CORRUPT_HINT}")
    spec = attrs["obs_spec"]
    array_modes = [m for m in attrs["obs_modes"] if m in ARRAY_MODES]
    if not isinstance(spec, dict) or any(not {"shape", "dtype"} <= set(spec.get(m, {})) for m in array_modes):
        raise StoreError(f"dmrl store {path}: corrupt attribute 'obs_spec' ({CORRUPT_HINT})")
    if attrs["dmrl_format_version"] != FORMAT_VERSION:
        raise StoreError(
            f"dmrl store {path}: format version {attrs['dmrl_format_version']!r}, "
            f"this dmrl reads {FORMAT_VERSION}; re-run dmrl collect"
        )
    return attrs


def parse_episode_info(path: Path, attrs: dict[str, Any]) -> dict[str, InfoField]:
    """The store's task columns from its ``episode_info`` attr; a store from before the attr is MultiPath's."""
    doc = attrs.get("episode_info")
    if doc is None:
        return dict(LEGACY_EPISODE_INFO)
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise StoreError(f"dmrl store {path}: corrupt attribute 'episode_info' ({CORRUPT_HINT})")
    return {k: InfoField.from_json(v) for k, v in doc.items()}


# ---------------------------------------------------------------------- an episode to append
def check_episode(
    ep: Episode,
    *,
    path: Path,
    obs_spec: ObsSpec,
    action_dim: int,
    episode_info: dict[str, InfoField],
    has_terminals: bool,
) -> None:
    """One-line ValueError unless `ep` fits the store at `path` (its modalities, shapes, dtypes, task keys and
    per-step terminals)."""
    for label, d, lead in (("obs", ep.obs, (ep.length,)), ("final_obs", ep.final_obs, ())):
        extra = sorted(set(d) - set(obs_spec))
        if extra:
            raise ValueError(
                f"Episode.{label}[{extra[0]!r}]: store {path} has no such modality "
                f"(store has: {', '.join(obs_spec) or 'none'})"
            )
        for m, (shape, dtype) in obs_spec.items():
            if m not in d:
                raise ValueError(f"Episode.{label}[{m!r}]: missing; store {path} expects it")
            x = d[m]
            if x.shape != (*lead, *shape) or x.dtype != np.dtype(dtype):
                raise ValueError(
                    f"Episode.{label}[{m!r}]: got {x.dtype}{list(x.shape)}, "
                    f"store expects {dtype}{list((*lead, *shape))}"
                )
    if ep.actions.shape[1] != action_dim:
        raise ValueError(f"Episode.actions: got Da={ep.actions.shape[1]}, store expects {action_dim}")
    have, want = set(ep.task_info), set(episode_info)
    if have != want:
        raise ValueError(
            f"Episode.task_info: got keys {sorted(have)}; store {path} keeps {sorted(want)} "
            "(the task's registered episode_info)"
        )
    for k, f in episode_info.items():
        f.check(k, ep.task_info[k])
    if has_terminals != (ep.terminals is not None):
        has = "keeps" if has_terminals else "keeps no"
        raise ValueError(
            f"Episode.terminals: got {'none' if ep.terminals is None else 'some'}; store {path} {has} "
            "per-step terminals (data/terminals); write to a store made with the same env (or re-collect)"
        )
    term = None if ep.terminals is None else np.asarray(ep.terminals)  # Episode checks it; a later edit may not
    if term is not None and (term.shape != (ep.length,) or term.dtype != np.bool_):
        raise ValueError(f"Episode.terminals: got {term.dtype}{list(term.shape)}, store expects bool[{ep.length}]")
