"""Pretrained Vision Transformer weights from a local file: timm's ViT state-dict layout mapped onto ViTBackbone.

Only local files are read (safetensors, or a torch pickle of tensors loaded with weights_only=True); nothing is
ever downloaded. Our backbone uses timm's parameter names, so the mapping is small:

    patch_embed.proj.*            same name
    pos_embed (1, 1 + g*g, C)     class-token position dropped; the g x g grid resized bilinearly if ours differs
    cls_token, head.*, fc_norm.*  dropped (patch tokens never see the classifier)
    blocks.{i}.attn.qkv.*         split into attn.q.* (first C rows) and attn.kv.* (last 2C rows: k then v)
    blocks.{i}.norm1/attn.proj/norm2/mlp.fc1/mlp.fc2, norm   same name

A file saved from our own backbone (attn.q / attn.kv, no class token) loads through the same path.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Classifier-side entries of timm checkpoints: a patch-token encoder has no use for them.
IGNORED_PREFIXES = ("cls_token", "dist_token", "head.", "head_dist.", "fc_norm.", "pre_logits.")


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Tensors of a local .safetensors file, or of a .pth/.bin/.pt file (torch.load with weights_only=True).

    A checkpoint that wraps its weights in {"model": ...} or {"state_dict": ...} is unwrapped, and a DDP
    "module." prefix is stripped.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"pretrained ViT weights: no file at {p} (weights are never downloaded)")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        sd: object = load_file(str(p))
    else:
        sd = torch.load(p, map_location="cpu", weights_only=True)
    for wrapper in ("model", "state_dict"):
        if isinstance(sd, dict) and isinstance(sd.get(wrapper), dict):
            sd = sd[wrapper]
    if not isinstance(sd, dict) or not all(isinstance(v, Tensor) for v in sd.values()):
        raise ValueError(f"pretrained ViT weights: {p} does not hold a flat dict of tensors")
    return {k.removeprefix("module."): v for k, v in sd.items()}


def resize_pos_embed(pos: Tensor, grid: tuple[int, int], has_class_token: bool) -> Tensor:
    """timm pos_embed (1, [1 +] g*g, C) -> ours (1, gh*gw, C): class position dropped, grid resized bilinearly."""
    n = pos.shape[1]
    prefix = 1 if has_class_token and math.isqrt(n - 1) ** 2 == n - 1 else 0
    side = math.isqrt(n - prefix)
    if pos.ndim != 3 or side * side != n - prefix:
        raise ValueError(f"pretrained ViT weights: pos_embed has shape {tuple(pos.shape)}; expected a square grid")
    patches = pos[:, prefix:]
    if (side, side) == grid:
        return patches
    c = pos.shape[-1]
    img = patches.float().reshape(1, side, side, c).permute(0, 3, 1, 2)  # (1, C, g, g)
    img = F.interpolate(img, size=grid, mode="bilinear", align_corners=False)
    return img.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], c).to(pos.dtype)


def convert_timm_vit(sd: dict[str, Tensor], grid: tuple[int, int]) -> dict[str, Tensor]:
    """timm ViT state dict -> ViTBackbone state dict (see the module docstring for the mapping)."""
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        if key.startswith(IGNORED_PREFIXES):
            continue
        if key == "pos_embed":
            out[key] = resize_pos_embed(value, grid, has_class_token="cls_token" in sd)
        elif key.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            if value.shape[0] % 3:
                raise ValueError(
                    f"pretrained ViT weights: {key} has shape {tuple(value.shape)}; rows must be 3 * width"
                )
            width = value.shape[0] // 3
            # timm reshapes qkv(x) to (B, N, 3, heads, C/heads): rows [0, C) are q, [C, 3C) are k then v with
            # the same head-major order that layers.Attention's kv projection unpacks.
            out[key.replace("attn.qkv", "attn.q")] = value[:width]
            out[key.replace("attn.qkv", "attn.kv")] = value[width:]
        else:
            out[key] = value
    return out


def load_vit_weights(backbone: nn.Module, path: str | Path) -> None:
    """Copy a local timm-format (or own-format) ViT checkpoint into ``backbone`` (a vision.ViTBackbone).

    Raises FileNotFoundError for a missing file and a one-line ValueError naming the first key that is
    missing, unexpected or of the wrong shape, so a size mismatch (say depth 4 against a 12-block file) is
    reported instead of half-loading.
    """
    src = convert_timm_vit(read_state_dict(path), backbone.grid)
    target = backbone.state_dict()
    for key, value in src.items():
        if key not in target:
            raise ValueError(f"pretrained ViT weights: unexpected key {key!r} in {path}; does the config's size match?")
        if tuple(value.shape) != tuple(target[key].shape):
            raise ValueError(
                f"pretrained ViT weights: {key} has shape {tuple(value.shape)} in {path}; "
                f"the config needs {tuple(target[key].shape)}"
            )
    missing = [k for k in target if k not in src]
    if missing:
        raise ValueError(f"pretrained ViT weights: {path} lacks {missing[0]!r} ({len(missing)} keys missing)")
    backbone.load_state_dict(src)
