"""Observation frames as tokens: every modality's tokens get a learned modality embedding and a learned embedding
of their frame index, so a fusion that ignores order (attention, pooling) still knows what and when a token is.

    ProprioTokenizer   joints (B, To, J), force (B, To, F), already normalised -> (B, To, D), one token per frame
    FrameTokenizer     a per-frame encoder over frames (B, To, ...) -> (B, To * N, D), frame-major
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn


def encode_frames(encoder: nn.Module, frames: Tensor, film: Tensor | None = None) -> Tensor:
    """Run a per-frame encoder on every frame: (B, To, *frame) -> (B, To, N, D), with To folded into the batch;
    film (B, F), if given, is passed to the encoder with each sample's row repeated for its To frames."""
    b, t = frames.shape[:2]
    if film is None:
        out = encoder(frames.flatten(0, 1))  # (B * To, N, D)
    else:
        out = encoder(frames.flatten(0, 1), film=film.repeat_interleave(t, 0))
    return out.view(b, t, *out.shape[1:])


class FrameEmbedding(nn.Module):
    """tokens (B, To, N, D) + modality embedding (D,) + time embedding (To, D) -> (B, To * N, D), frame 0 first."""

    def __init__(self, n_obs_steps: int, dim: int) -> None:
        super().__init__()
        if n_obs_steps < 1 or dim < 1:
            raise ValueError(f"FrameEmbedding: need n_obs_steps >= 1 and dim >= 1; got {n_obs_steps}, {dim}")
        self.n_obs_steps = n_obs_steps
        self.modality = nn.Parameter(torch.zeros(dim))
        self.time = nn.Parameter(torch.zeros(n_obs_steps, 1, dim))
        nn.init.trunc_normal_(self.modality, std=0.02)
        nn.init.trunc_normal_(self.time, std=0.02)

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.ndim != 4 or tokens.shape[1] != self.n_obs_steps:
            raise ValueError(
                f"FrameEmbedding: got tokens of shape {tuple(tokens.shape)}; expected (B, {self.n_obs_steps}, N, D)"
            )
        return (tokens + self.time + self.modality).flatten(1, 2)


class FrameTokenizer(nn.Module):
    """Image-like frames through a per-frame encoder, with modality and time embeddings.

    frames (B, To, *frame) -> (B, To * N, D) where the encoder maps (B, *frame) -> (B, N, D) and has
    `n_tokens` (N) and `out_dim` (D) attributes (vision.ViTEncoder, ResNet18GN, DepthEncoder).
    """

    def __init__(self, encoder: nn.Module, n_obs_steps: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.embed = FrameEmbedding(n_obs_steps, int(encoder.out_dim))
        self.n_tokens = n_obs_steps * int(encoder.n_tokens)
        self.out_dim = int(encoder.out_dim)

    def forward(self, frames: Tensor, film: Tensor | None = None) -> Tensor:
        return self.embed(encode_frames(self.encoder, frames, film))


class ProprioTokenizer(nn.Module):
    """Low-dimensional modalities (joints, force): one token per frame per modality.

    forward(name, x (B, To, dims[name]) already normalised) -> (B, To, D): a linear projection of its own per
    modality, plus that modality's embedding and the embedding of each frame's index (a normalisation layer plus
    positional encoding, the usual proprioception tokenizer; normalisation lives in the data normalizer here).
    """

    def __init__(self, dims: Mapping[str, int], n_obs_steps: int, dim: int) -> None:
        super().__init__()
        if not dims or any(d < 1 for d in dims.values()):
            raise ValueError(f"ProprioTokenizer.dims: got {dict(dims)}; allowed a non-empty {{name: dim >= 1}}")
        self.dims = dict(dims)
        self.n_obs_steps = n_obs_steps
        self.proj = nn.ModuleDict({k: nn.Linear(d, dim) for k, d in self.dims.items()})
        self.embed = nn.ModuleDict({k: FrameEmbedding(n_obs_steps, dim) for k in self.dims})
        self.out_dim = dim

    def forward(self, name: str, x: Tensor) -> Tensor:
        if name not in self.dims:
            raise KeyError(f"ProprioTokenizer: unknown modality {name!r}; configured: {list(self.dims)}")
        expected = (self.n_obs_steps, self.dims[name])
        if x.ndim != 3 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"ProprioTokenizer: got {name} of shape {tuple(x.shape)}; expected (B, {expected})")
        return self.embed[name](self.proj[name](x)[:, :, None])  # (B, To, 1, D) -> (B, To, D)
