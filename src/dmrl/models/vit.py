"""Vision Transformer image encoder (Dosovitskiy et al. 2021): RGB frames -> patch tokens.

    ViTEncoder     rgb   uint8 (B, 3 * n_cams, H, W)     -> (B, n_cams * (H/p) * (W/p), D)

Cameras stacked on channels are split and run through one shared backbone: pretrained 3-channel weights stay
valid for any number of cameras, and a learned per-camera embedding tells the fusion which view a token is from.
Each encoder has `n_tokens` (N) and `out_dim` (D). Geometry (out_dim, image_size, n_cameras) comes from the
caller; the config describes only the network. The backbone, camera head and the frame checks here are shared
with the depth encoder (depth.py) and the ResNet (resnet.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dmrl.models.layers import SelfAttentionBlock, run_block
from dmrl.models.vit_weights import load_vit_weights

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# name -> (width, depth, heads, patch). "tiny" is ours for CPU runs at 64 x 64 (64 patch tokens); "small" and
# "base" are ViT-S/16 and ViT-B/16, so timm checkpoints of those load unchanged.
VIT_SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (192, 4, 3, 8),
    "small": (384, 12, 6, 16),
    "base": (768, 12, 12, 16),
}


@dataclass
class ViTConfig:
    """RGB Vision Transformer; width, depth, n_heads and patch_size default to the named size."""

    size: str = "tiny"
    """tiny (192 wide, 4 blocks, 3 heads, patch 8), small (ViT-S/16) or base (ViT-B/16)."""
    width: int | None = None
    """Token width inside the backbone (None: from size)."""
    depth: int | None = None
    """Transformer blocks (None: from size)."""
    n_heads: int | None = None
    """Attention heads (None: from size)."""
    patch_size: int | None = None
    """Square patch side in pixels; H and W must be multiples of it (None: from size)."""
    mlp_ratio: int = 4
    """MLP hidden width / width."""
    freeze: bool = False
    """No gradients for the backbone (run under no_grad); the projection to D and camera embeddings still train."""
    pretrained: str | None = None
    """Local .safetensors or timm-format .pth/.bin file loaded into the backbone at construction; never downloaded."""
    mean: tuple[float, float, float] = IMAGENET_MEAN
    """Per-channel mean after scaling pixels to [0, 1] (use the pretrained model's own; timm augreg uses 0.5)."""
    std: tuple[float, float, float] = IMAGENET_STD
    """Per-channel std after scaling pixels to [0, 1]."""
    attn_fp32: bool = False
    """Force attention to fp32 with autocast off (see layers.Attention); by default SDPA's fp32 softmax is used."""

    def __post_init__(self) -> None:
        if self.size not in VIT_SIZES:
            raise ValueError(f"ViTConfig.size: got {self.size!r}; allowed: {', '.join(VIT_SIZES)}")
        width, depth, heads, patch = VIT_SIZES[self.size]
        self.width = width if self.width is None else self.width
        self.depth = depth if self.depth is None else self.depth
        self.n_heads = heads if self.n_heads is None else self.n_heads
        self.patch_size = patch if self.patch_size is None else self.patch_size
        check_transformer("ViTConfig", self.width, self.depth, self.n_heads, self.patch_size, self.mlp_ratio)
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"ViTConfig.mean/std: got {self.mean}, {self.std}; allowed 3 values each, std > 0")


def check_transformer(name: str, width: int, depth: int, heads: int, patch: int, mlp_ratio: int) -> None:
    """One-line ValueError for transformer sizes that cannot build (non-positive, or width not divisible by heads)."""
    for key, value in (("width", width), ("depth", depth), ("n_heads", heads), ("patch_size", patch)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}.{key}: got {value!r}; allowed a positive integer")
    if width % heads:
        raise ValueError(f"{name}.width: got {width}, not divisible by n_heads={heads}; pick a multiple of n_heads")
    if mlp_ratio < 1:
        raise ValueError(f"{name}.mlp_ratio: got {mlp_ratio}; allowed a positive integer")


def check_geometry(name: str, out_dim: int, image_size: tuple[int, int], n_cameras: int, patch: int = 1) -> None:
    """One-line ValueError for an output width, image size or camera count an encoder cannot take."""
    if not isinstance(out_dim, int) or out_dim < 1:
        raise ValueError(f"{name}: out_dim got {out_dim!r}; allowed a positive integer")
    if not isinstance(n_cameras, int) or n_cameras < 1:
        raise ValueError(f"{name}: n_cameras got {n_cameras!r}; allowed a positive integer")
    if len(image_size) != 2 or any(s < patch or s % patch for s in image_size):
        raise ValueError(f"{name}: image_size got {tuple(image_size)}; allowed (H, W), both multiples of {patch}")


def unit_rgb(images: Tensor, n_cameras: int, image_size: tuple[int, int], name: str, dtype: torch.dtype) -> Tensor:
    """uint8 (B, 3 * n_cams, H, W) -> float (B * n_cams, 3, H, W) in [0, 1]; a float input is taken as scaled."""
    expected = (3 * n_cameras, *image_size)
    if images.ndim != 4 or tuple(images.shape[1:]) != expected:
        raise ValueError(f"{name}: got images of shape {tuple(images.shape)}; expected (B, {expected}) uint8")
    x = images.to(dtype) / 255.0 if images.dtype == torch.uint8 else images.to(dtype)
    return x.reshape(-1, 3, *image_size)


class PatchEmbed(nn.Module):
    """Non-overlapping patches as one strided conv: (B, C_in, H, W) -> (B, (H/p) * (W/p), width), row-major."""

    def __init__(self, in_chans: int, width: int, patch_size: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, width, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class ViTBackbone(nn.Module):
    """Patch embedding + learned positions + pre-LN blocks + final LayerNorm (timm parameter names).

    x (B, C_in, H, W) float, already normalised -> (B, N, width), N = (H/p) * (W/p). There is no class token:
    the fusion reads patch tokens, and a pretrained class token is dropped on load.
    """

    def __init__(
        self,
        width: int,
        depth: int,
        n_heads: int,
        patch_size: int,
        image_size: tuple[int, int],
        in_chans: int = 3,
        mlp_ratio: int = 4,
        attn_fp32: bool = False,
    ) -> None:
        super().__init__()
        self.grid = (image_size[0] // patch_size, image_size[1] // patch_size)
        self.patch_embed = PatchEmbed(in_chans, width, patch_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.grid[0] * self.grid[1], width))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.blocks = nn.ModuleList(SelfAttentionBlock(width, n_heads, mlp_ratio, attn_fp32) for _ in range(depth))
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.grad_checkpointing = False  # set by the training engine

    def forward(self, x: Tensor) -> Tensor:
        h = self.patch_embed(x) + self.pos_embed
        for block in self.blocks:
            h = run_block(block, h, checkpoint=self.grad_checkpointing)
        return self.norm(h)


class CameraTokens(nn.Module):
    """Per-camera features (B * n_cams, N, C) -> projection to D + learned camera embedding -> (B, n_cams * N, D)."""

    def __init__(self, in_dim: int, out_dim: int, n_cameras: int) -> None:
        super().__init__()
        self.n_cameras = n_cameras
        self.proj = nn.Linear(in_dim, out_dim)
        self.camera_embed = nn.Parameter(torch.zeros(n_cameras, 1, out_dim))
        nn.init.trunc_normal_(self.camera_embed, std=0.02)

    def forward(self, feats: Tensor) -> Tensor:
        bv, n, _ = feats.shape
        tokens = self.proj(feats).view(bv // self.n_cameras, self.n_cameras, n, -1) + self.camera_embed
        return tokens.flatten(1, 2)


class ViTEncoder(nn.Module):
    """RGB frames -> patch tokens: uint8 (B, 3 * n_cams, H, W) -> (B, n_cams * (H/p) * (W/p), out_dim).

    Pixels are scaled to [0, 1] (a floating input is taken as already scaled), then normalised with the
    config's mean/std. With `freeze` the backbone runs under no_grad and holds no trainable parameter.
    """

    def __init__(
        self,
        config: ViTConfig | None = None,
        *,
        out_dim: int = 256,
        image_size: tuple[int, int] = (64, 64),
        n_cameras: int = 1,
    ) -> None:
        super().__init__()
        c = self.config = config or ViTConfig()
        assert c.width and c.depth and c.n_heads and c.patch_size  # filled in by ViTConfig.__post_init__
        check_geometry("ViTEncoder", out_dim, image_size, n_cameras, c.patch_size)
        self.image_size, self.n_cameras, self.out_dim = tuple(image_size), n_cameras, out_dim
        self.backbone = ViTBackbone(
            c.width, c.depth, c.n_heads, c.patch_size, self.image_size, 3, c.mlp_ratio, c.attn_fp32
        )
        if c.pretrained is not None:
            load_vit_weights(self.backbone, c.pretrained)
        if c.freeze:
            self.backbone.requires_grad_(False)
        self.head = CameraTokens(c.width, out_dim, n_cameras)
        self.n_tokens = n_cameras * self.backbone.grid[0] * self.backbone.grid[1]
        # Derived from the config, so kept out of checkpoints.
        self.register_buffer("mean", torch.tensor(c.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(c.std).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        x = unit_rgb(images, self.n_cameras, self.image_size, "ViTEncoder", self.mean.dtype)  # (B * n_cams, 3, H, W)
        x = (x - self.mean) / self.std
        if self.config.freeze:
            with torch.no_grad():  # no activations stored for a backbone that will not be updated
                feats = self.backbone(x)
        else:
            feats = self.backbone(x)
        return self.head(feats)
