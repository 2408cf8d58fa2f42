"""Policy checkpoints (safetensors weights + a JSON config, as lerobot's ``pretrained.py``): save, load, migrate.

A directory holds ``policy.safetensors`` (weights, normaliser statistics included) and ``config.json`` with
everything a rebuild needs without the dataset: the chunk config, the policy config, obs_dims ({vector key: length,
frame key: [C, H, W]}; the multimodal encoder's geometry is read off them), the action dim, the checkpoint
``format`` and the dmrl version that wrote it. Only ``dmrl.policies`` is needed to load one: no
algorithm, engine or env.

Format policy: ``FORMAT`` is the one this dmrl writes. A change to config.json that an older loader would misread
bumps it and adds ``MIGRATIONS[old]``, which turns a config of format ``old`` into one of ``old + 1``; loading
applies them in turn, so every checkpoint ever written keeps loading (tests/artifacts/golden_* hold format 1,
lowdim and multimodal). A newer format than this dmrl knows is a one-line error, never a guess.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from dmrl import __version__
from dmrl.config_utils import from_dict, to_dict
from dmrl.models.multimodal import MultimodalEncoderConfig
from dmrl.policies import POLICIES, ChunkConfig, ChunkPolicy

FORMAT = 2
"""The checkpoint format this dmrl writes (config.json's "format")."""
WEIGHTS = "policy.safetensors"
CONFIG = "config.json"

Migration = Callable[[dict[str, Any]], dict[str, Any]]

#: Format 1's multimodal fields that the data decides (format 2 reads them off obs_keys, To and obs_dims).
_GEOMETRY = ("modalities", "n_obs_steps", "image_size", "n_cameras", "joints_dim", "force_dim")


def _chunk_1_to_2(cfg: dict[str, Any]) -> dict[str, Any]:
    """Format 1 -> 2: the encoder became a choice. chunk {encoder_type, encoder (lowdim), multimodal, language}
    -> chunk {encoder: {type: lowdim, ...}} or {encoder: {type: multimodal, ..., language, experimental}}; the
    multimodal geometry is dropped, LanguageConfig.cache_size too (an LRU bound, no effect on the weights), and
    instruction_pool moves under the encoder's experimental settings; the diffusion policy's DDIM ``eta`` is
    ``ddim_eta``."""
    chunk = cfg["chunk"]
    kind = chunk.pop("encoder_type", "lowdim")  # checkpoints older than the multimodal encoder have none
    lowdim = chunk.pop("encoder", {})
    multimodal = chunk.pop("multimodal", {})
    language = chunk.pop("language", {})
    language.pop("cache_size", None)
    if kind == "lowdim":
        chunk["encoder"] = {"type": "lowdim", **lowdim}
    else:
        for key in _GEOMETRY:
            multimodal.pop(key, None)
        experimental = (
            {"instruction_pool": multimodal.pop("instruction_pool")} if "instruction_pool" in multimodal else {}
        )
        chunk["encoder"] = {"type": kind, **multimodal, "language": language, "experimental": experimental}
    if cfg.get("policy") == "diffusion" and "eta" in cfg.get("config", {}):
        cfg["config"]["ddim_eta"] = cfg["config"].pop("eta")  # renamed apart from Diffusion-QL's Q weight eta
    return cfg


#: format n -> migrate(config.json dict of format n) -> config.json dict of format n + 1.
MIGRATIONS: dict[int, Migration] = {1: _chunk_1_to_2}


def _atomic_write(path: Path, write: Callable[[str], object]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)  # a crash leaves the old file or the new one, never half of one
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_policy(directory: Path, policy: ChunkPolicy, meta: dict[str, Any] | None = None) -> Path:
    """Write ``policy.safetensors`` and ``config.json`` (format ``FORMAT``) into ``directory``; returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}
    config = {
        "format": FORMAT,
        "dmrl": __version__,
        "policy": policy.name,
        "chunk": to_dict(policy.chunk),
        "config": to_dict(policy.config),  # type: ignore[attr-defined]  # every registered policy has one
        "obs_dims": policy.obs_dims,
        "action_dim": policy.action_dim,
        "meta": to_dict(meta or {}),
    }
    _atomic_write(directory / WEIGHTS, lambda p: save_file(tensors, p))
    _atomic_write(directory / CONFIG, lambda p: Path(p).write_text(json.dumps(config, indent=2)))
    return directory


def upgrade_config(cfg: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """A checkpoint's config.json dict brought to format ``FORMAT`` by ``MIGRATIONS`` (``cfg`` is not modified).

    A missing, unknown or newer format is a one-line error naming the format found, the dmrl that wrote it and
    the formats this dmrl reads.
    """
    fmt = cfg.get("format")
    reads = f"this dmrl {__version__} reads format{'s 1..' if FORMAT > 1 else ' '}{FORMAT}"
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise ValueError(f"checkpoint {where}: no valid format number (got {fmt!r}); {reads}")
    if fmt > FORMAT:
        writer = f"dmrl {cfg['dmrl']}" if "dmrl" in cfg else "a newer dmrl"
        raise ValueError(f"checkpoint {where}: format {fmt}, written by {writer}; {reads}: upgrade dmrl to load it")
    cfg = copy.deepcopy(cfg)  # migrations may edit in place; the caller's dict stays as read
    while fmt < FORMAT:
        if fmt not in MIGRATIONS:
            raise ValueError(f"checkpoint {where}: format {fmt} has no migration to {fmt + 1}; {reads}")
        cfg = MIGRATIONS[fmt](cfg)
        fmt += 1
        cfg["format"] = fmt
    return cfg


def load_policy(directory: Path, device: str = "cpu") -> tuple[ChunkPolicy, dict[str, Any]]:
    """Rebuild a policy saved by :func:`save_policy` (any format up to ``FORMAT``) in eval mode on ``device``;
    returns (policy, the meta dict saved with it). Any missing or mismatched piece is a one-line error."""
    directory = Path(directory)
    cfg_path, w_path = directory / CONFIG, directory / WEIGHTS
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"checkpoint {directory}: missing {p.name} (is this a dmrl checkpoint directory?)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"checkpoint {cfg_path}: corrupt JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"checkpoint {cfg_path}: expected a JSON object, got {type(cfg).__name__}")
    cfg = upgrade_config(cfg, str(cfg_path))
    if cfg.get("policy") not in POLICIES:
        raise ValueError(f"checkpoint {cfg_path}: unknown policy {cfg.get('policy')!r} (known: {', '.join(POLICIES)})")
    cls, cfg_cls = POLICIES[cfg["policy"]]
    chunk = from_dict(ChunkConfig, cfg["chunk"], "chunk")
    if isinstance(chunk.encoder, MultimodalEncoderConfig):
        # Every weight comes from policy.safetensors: a pretrained ViT file named in the config need not exist here.
        enc = chunk.encoder
        chunk = replace(chunk, encoder=replace(enc, vit=replace(enc.vit, pretrained=None)))
    policy = cls(chunk, from_dict(cfg_cls, cfg["config"], "config"), cfg["obs_dims"], int(cfg["action_dim"]), None)
    try:
        state = load_file(str(w_path), device=device)
    except Exception as e:  # safetensors raises several types for truncated/corrupt files
        raise ValueError(f"checkpoint {w_path}: unreadable weights ({type(e).__name__}: {e})") from None
    result = policy.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"checkpoint {w_path}: weights do not match the config (missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]})"
        )
    return policy.to(device).eval(), cfg.get("meta", {})
