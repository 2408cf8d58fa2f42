"""ResNet-18 with GroupNorm and a spatial-softmax keypoint head (Diffusion Policy's image encoder, Chi et al. 2023).

    ResNet18GN     rgb   uint8 (B, 3 * n_cams, H, W)     -> (B, n_cams * n_keypoints, D)

Cameras stacked on channels are split and run through one shared backbone, with a learned per-camera embedding
added to each camera's tokens. Geometry (out_dim, image_size, n_cameras) comes from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dmrl.models.layers import run_block
from dmrl.models.vit import IMAGENET_MEAN, IMAGENET_STD, check_geometry, unit_rgb


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
    """Run the convolutions on NHWC tensors (channels-last), which oneDNN's CPU kernels and cuDNN under mixed
    precision run faster; the values are the same."""

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
