"""Image encoders that emit tokens: a Vision Transformer (Dosovitskiy et al. 2021) for RGB, a small ViT for depth.

Every encoder maps one observation frame to tokens of width D:

    ViTEncoder     rgb   uint8 (B, 3 * n_cams, H, W)     -> (B, n_cams * (H/p) * (W/p), D)
    DepthEncoder   depth float (B, n_cams, H, W) metres  -> (B, n_cams * (H/p) * (W/p), D)
    ResNet18GN     rgb   uint8 (B, 3 * n_cams, H, W)     -> (B, n_cams * n_keypoints, D)

Cameras stacked on channels are split and run through one shared backbone: pretrained 3-channel weights stay
valid for any number of cameras, and a learned per-camera embedding tells the fusion which view a token is from.
Each encoder has `n_tokens` (N) and `out_dim` (D). Geometry (out_dim, image_size, n_cameras) comes from the
caller; the config describes only the network.
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
        _check_transformer("ViTConfig", self.width, self.depth, self.n_heads, self.patch_size, self.mlp_ratio)
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"ViTConfig.mean/std: got {self.mean}, {self.std}; allowed 3 values each, std > 0")


@dataclass
class DepthConfig:
    """Small ViT of its own for metric depth (not the RGB weights: depth statistics are nothing like RGB's)."""

    width: int = 128
    """Token width inside the backbone."""
    depth: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads."""
    patch_size: int = 8
    """Square patch side in pixels; H and W must be multiples of it."""
    mlp_ratio: int = 4
    """MLP hidden width / width."""
    max_depth: float = 2.0
    """Metres; depth is clamped to [0, max_depth] (the MultiPath renderer's far plane reads 2.0)."""
    attn_fp32: bool = False
    """Force attention to fp32 with autocast off (see layers.Attention)."""

    def __post_init__(self) -> None:
        _check_transformer("DepthConfig", self.width, self.depth, self.n_heads, self.patch_size, self.mlp_ratio)
        if not self.max_depth > 0:
            raise ValueError(f"DepthConfig.max_depth: got {self.max_depth}; allowed a positive number of metres")


def _check_transformer(name: str, width: int, depth: int, heads: int, patch: int, mlp_ratio: int) -> None:
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


class DepthEncoder(nn.Module):
    """Metric depth -> patch tokens: float (B, n_cams, H, W) metres -> (B, n_cams * (H/p) * (W/p), out_dim).

    NaN (no sensor return) reads as 0, +inf as max_depth; values are clamped to [0, max_depth] and mapped
    linearly to [-1, 1] before a small ViT of its own.
    """

    def __init__(
        self,
        config: DepthConfig | None = None,
        *,
        out_dim: int = 256,
        image_size: tuple[int, int] = (64, 64),
        n_cameras: int = 1,
    ) -> None:
        super().__init__()
        c = self.config = config or DepthConfig()
        check_geometry("DepthEncoder", out_dim, image_size, n_cameras, c.patch_size)
        self.image_size, self.n_cameras, self.out_dim = tuple(image_size), n_cameras, out_dim
        self.backbone = ViTBackbone(
            c.width, c.depth, c.n_heads, c.patch_size, self.image_size, 1, c.mlp_ratio, c.attn_fp32
        )
        self.head = CameraTokens(c.width, out_dim, n_cameras)
        self.n_tokens = n_cameras * self.backbone.grid[0] * self.backbone.grid[1]

    def forward(self, depth: Tensor) -> Tensor:
        expected = (self.n_cameras, *self.image_size)
        if depth.ndim != 4 or tuple(depth.shape[1:]) != expected:
            raise ValueError(f"DepthEncoder: got depth of shape {tuple(depth.shape)}; expected (B, {expected})")
        m = self.config.max_depth
        x = torch.nan_to_num(depth.float(), nan=0.0, posinf=m, neginf=0.0).clamp(0.0, m)
        x = x.reshape(-1, 1, *self.image_size) * (2.0 / m) - 1.0  # (B * n_cams, 1, H, W) in [-1, 1]
        return self.head(self.backbone(x))


# --------------------------------------------------------------------------- ResNet-18 with GroupNorm


@dataclass
class ResNetGNConfig:
    """ResNet-18 with GroupNorm and a spatial-softmax keypoint head: Diffusion Policy's image encoder (from scratch).

    BatchNorm is replaced by GroupNorm because batch statistics go stale under EMA weights and small or
    correlated batches (Chi et al. 2023).
    """

    widths: tuple[int, int, int, int] = (64, 128, 256, 512)
    """Channels of the four stages (two basic blocks each)."""
    group_size: int = 16
    """Channels per GroupNorm group (Diffusion Policy: num_groups = channels // 16)."""
    n_keypoints: int = 32
    """Spatial-softmax keypoints per camera, one token each."""
    stem_pool: bool = True
    """Max-pool after the stem (standard); False doubles the final map: 4 x 4 instead of 2 x 2 at 64 x 64."""
    stage_strides: tuple[int, int, int, int] = (1, 2, 2, 2)
    """Stride of each stage's first block (ResNet: 1, 2, 2, 2). A 1 in the last stage doubles the keypoint map
    (8 x 8 at 64 x 64 without the stem pool): finer keypoints for small objects in small images."""
    mean: tuple[float, float, float] = IMAGENET_MEAN
    """Per-channel mean after scaling pixels to [0, 1]."""
    std: tuple[float, float, float] = IMAGENET_STD
    """Per-channel std after scaling pixels to [0, 1]."""
    channels_last: bool = True
    """Run the convolutions on NHWC tensors. oneDNN's CPU kernels are faster in it (preset step 811 -> 675 ms,
    benchmarks/results/multimodal.md) and so are cuDNN's under mixed precision; the values are the same."""

    def __post_init__(self) -> None:
        self.widths = tuple(self.widths)  # type: ignore[assignment]
        self.stage_strides = tuple(self.stage_strides)  # type: ignore[assignment]
        if len(self.stage_strides) != 4 or any(st not in (1, 2) for st in self.stage_strides):
            raise ValueError(f"ResNetGNConfig.stage_strides: got {self.stage_strides}; allowed 4 values, each 1 or 2")
        if self.group_size < 1 or self.n_keypoints < 1:
            raise ValueError(
                f"ResNetGNConfig: group_size and n_keypoints must be >= 1; got {self.group_size}, {self.n_keypoints}"
            )
        if len(self.widths) != 4 or any(w < 1 or w % _groups(w, self.group_size) for w in self.widths):
            raise ValueError(
                f"ResNetGNConfig.widths: got {self.widths}; allowed 4 positive channel counts, each divisible by "
                f"max(1, channels // group_size)"
            )
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"ResNetGNConfig.mean/std: got {self.mean}, {self.std}; allowed 3 values each, std > 0")


def _groups(channels: int, group_size: int) -> int:
    return max(1, channels // group_size)


class BasicBlockGN(nn.Module):
    """ResNet basic block with GroupNorm: (B, C_in, h, w) -> (B, C_out, h / stride, w / stride)."""

    def __init__(self, c_in: int, c_out: int, stride: int, group_size: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(_groups(c_out, group_size), c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(_groups(c_out, group_size), c_out)
        self.act = nn.ReLU()
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.GroupNorm(_groups(c_out, group_size), c_out)
            )

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.norm1(self.conv1(x)))
        return self.act(self.norm2(self.conv2(h)) + self.downsample(x))


class SpatialSoftmax(nn.Module):
    """Keypoints of a feature map (Levine et al. 2016, robomimic): a 1x1 conv gives K maps, a softmax over the
    locations of each gives a distribution, its expectation is the keypoint.

    feats (B, C, h, w) -> (B, K, 2): (x, y) in (-1, 1), x along the width, at pixel centres (a 1 x 1 map reads 0).
    """

    def __init__(self, c_in: int, n_keypoints: int, feat_size: tuple[int, int]) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, n_keypoints, 1)
        h, w = feat_size
        ys = (torch.arange(h) + 0.5) / h * 2 - 1
        xs = (torch.arange(w) + 0.5) / w * 2 - 1
        grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1).reshape(h * w, 2)  # row-major (x, y)
        self.register_buffer("grid", grid, persistent=False)

    def forward(self, feats: Tensor) -> Tensor:
        # fp32 softmax: under fp16 autocast a peaked map over many locations underflows to all-zero weights.
        attn = self.conv(feats).flatten(2).float().softmax(dim=-1)  # (B, K, h * w)
        return attn @ self.grid


class ResNet18GN(nn.Module):
    """RGB frames -> keypoint tokens: uint8 (B, 3 * n_cams, H, W) -> (B, n_cams * n_keypoints, out_dim).

    Token k is a linear map of its own keypoint (x_k, y_k) to D plus a learned per-keypoint bias (its identity,
    since attention ignores order): Diffusion Policy flattens the keypoints into one Linear; splitting that
    Linear per keypoint keeps one token per keypoint for the fusion.
    """

    def __init__(
        self,
        config: ResNetGNConfig | None = None,
        *,
        out_dim: int = 256,
        image_size: tuple[int, int] = (64, 64),
        n_cameras: int = 1,
    ) -> None:
        super().__init__()
        c = self.config = config or ResNetGNConfig()
        check_geometry("ResNet18GN", out_dim, image_size, n_cameras)
        self.image_size, self.n_cameras, self.out_dim = tuple(image_size), n_cameras, out_dim
        w, g = c.widths, c.group_size
        self.stem = nn.Sequential(
            nn.Conv2d(3, w[0], 7, 2, 3, bias=False),
            nn.GroupNorm(_groups(w[0], g), w[0]),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1) if c.stem_pool else nn.Identity(),
        )
        blocks, c_in = [], w[0]
        for i, c_out in enumerate(w):
            blocks += [BasicBlockGN(c_in, c_out, c.stage_strides[i], g), BasicBlockGN(c_out, c_out, 1, g)]
            c_in = c_out
        self.blocks = nn.ModuleList(blocks)
        # Every stride-2 layer (pad 1 or 3) maps a side s to ceil(s / 2): the stem conv, the pool, strided stages.
        halvings = 1 + int(c.stem_pool) + sum(st == 2 for st in c.stage_strides)
        feat = tuple(-(-s // 2**halvings) for s in self.image_size)
        self.keypoints = SpatialSoftmax(w[-1], c.n_keypoints, (feat[0], feat[1]))
        self.kp_weight = nn.Parameter(torch.empty(c.n_keypoints, 2, out_dim).uniform_(-(0.5**0.5), 0.5**0.5))
        self.kp_bias = nn.Parameter(torch.zeros(c.n_keypoints, out_dim))
        nn.init.trunc_normal_(self.kp_bias, std=0.02)
        self.camera_embed = nn.Parameter(torch.zeros(n_cameras, 1, out_dim))
        nn.init.trunc_normal_(self.camera_embed, std=0.02)
        self.n_tokens = n_cameras * c.n_keypoints
        self.register_buffer("mean", torch.tensor(c.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(c.std).view(1, 3, 1, 1), persistent=False)
        self.grad_checkpointing = False  # set by the training engine

    def forward(self, images: Tensor, film: Tensor | None = None) -> Tensor:
        """film (B, 2C) or None: (gamma, beta) applied to the last feature map as h * (1 + gamma) + beta."""
        b = images.shape[0]
        x = (unit_rgb(images, self.n_cameras, self.image_size, "ResNet18GN", self.mean.dtype) - self.mean) / self.std
        if self.config.channels_last:  # every conv's output keeps its input's layout, so once here is enough
            x = x.contiguous(memory_format=torch.channels_last)
        h = self.stem(x)
        for block in self.blocks:
            h = run_block(block, h, checkpoint=self.grad_checkpointing)
        if film is not None:  # cameras are folded into the batch: each sample's row serves all its cameras
            gamma, beta = film.repeat_interleave(self.n_cameras, 0).to(h.dtype)[:, :, None, None].chunk(2, dim=1)
            h = h * (1 + gamma) + beta
        xy = self.keypoints(h).to(self.kp_weight.dtype)  # (B * n_cams, K, 2)
        tokens = (xy[:, :, None, :] @ self.kp_weight).squeeze(2) + self.kp_bias  # (B * n_cams, K, D)
        return (tokens.view(b, self.n_cameras, -1, self.out_dim) + self.camera_embed).flatten(1, 2)
