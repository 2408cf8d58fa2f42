"""Policy checkpoints: weights (normaliser included) in safetensors + a JSON config; written atomically.

config.json holds everything a rebuild needs without the dataset: the chunk config (with the multimodal encoder's
geometry already resolved from the data), the policy config, obs_dims ({vector key: length, frame key: [C, H, W]})
and the action dim. Checkpoints of lowdim policies written before the multimodal encoder load unchanged.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from dmrl.config import from_dict, to_dict
from dmrl.policies import POLICIES, ChunkConfig, ChunkPolicy

FORMAT = 1
WEIGHTS = "policy.safetensors"
CONFIG = "config.json"


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)  # a crash leaves the old file or the new one, never half of one
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_policy(directory: Path, policy: ChunkPolicy, meta: dict[str, Any] | None = None) -> Path:
    """Write ``policy.safetensors`` and ``config.json`` into ``directory``; returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}
    config = {
        "format": FORMAT,
        "policy": policy.name,
        "chunk": to_dict(policy.chunk),
        "config": to_dict(policy.config),
        "obs_dims": policy.obs_dims,
        "action_dim": policy.action_dim,
        "meta": to_dict(meta or {}),
    }
    _atomic_write(directory / WEIGHTS, lambda p: save_file(tensors, p))
    _atomic_write(directory / CONFIG, lambda p: Path(p).write_text(json.dumps(config, indent=2)))
    return directory


def load_policy(directory: Path, device: str = "cpu") -> tuple[ChunkPolicy, dict[str, Any]]:
    """Rebuild a policy saved by :func:`save_policy`; any missing or mismatched piece is a one-line error."""
    directory = Path(directory)
    cfg_path, w_path = directory / CONFIG, directory / WEIGHTS
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"checkpoint {directory}: missing {p.name} (is this a dmrl checkpoint directory?)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"checkpoint {cfg_path}: corrupt JSON ({e.msg} at line {e.lineno})") from None
    if cfg.get("format") != FORMAT or cfg.get("policy") not in POLICIES:
        raise ValueError(
            f"checkpoint {cfg_path}: unsupported format {cfg.get('format')!r} or policy "
            f"{cfg.get('policy')!r} (known: {', '.join(POLICIES)})"
        )
    cls, cfg_cls = POLICIES[cfg["policy"]]
    chunk = from_dict(ChunkConfig, cfg["chunk"], "chunk")
    # Every weight comes from policy.safetensors: a pretrained ViT file named in the config need not exist here.
    mm = chunk.multimodal
    chunk = replace(chunk, multimodal=replace(mm, vit=replace(mm.vit, pretrained=None)))
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
