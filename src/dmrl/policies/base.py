"""What every policy shares: normalisation inside the module, To-frame history and a Ta-step action queue.

A policy maps raw observations to raw actions: statistics are buffers of the module, so they travel in
the checkpoint and ``act`` needs nothing else (Diffusion Policy's interface, receding-horizon execution).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from dmrl.data import Normalizer
from dmrl.models.proprio import LowDimEncoder, LowDimEncoderConfig


@dataclass
class ChunkConfig:
    """Observation/action horizons and the data a policy is built for (shared by all policies)."""

    obs_keys: tuple[str, ...] = ("state",)
    """Low-dim observation keys the encoder reads (the multimodal encoder adds images and text)."""
    n_obs_steps: int = 2
    """To: observation frames the policy conditions on."""
    horizon: int = 16
    """Tp: actions predicted per chunk."""
    n_action_steps: int = 8
    """Ta: actions executed from each chunk before replanning (receding horizon)."""
    encoder: LowDimEncoderConfig = field(default_factory=LowDimEncoderConfig)

    def __post_init__(self) -> None:
        self.obs_keys = tuple(self.obs_keys)
        if not (
            1 <= self.n_obs_steps <= self.horizon and 1 <= self.n_action_steps <= self.horizon - self.n_obs_steps + 1
        ):
            raise ValueError(
                f"horizons: need 1 <= To <= Tp and 1 <= Ta <= Tp - To + 1, got To={self.n_obs_steps} "
                f"Tp={self.horizon} Ta={self.n_action_steps}"
            )


class NormalizerModule(nn.Module):
    """Normaliser statistics as buffers (saved with the weights): y = x * scale + offset per key."""

    def __init__(self, norm: Normalizer | None, keys: tuple[str, ...], dims: dict[str, int]):
        super().__init__()
        self.keys = keys
        for k in keys:
            if norm is not None and k not in norm:
                raise KeyError(f"normalizer has no statistics for {k!r} (has: {', '.join(norm.keys)})")
            scale = torch.as_tensor(norm.scale[k]) if norm is not None else torch.ones(dims[k])
            offset = torch.as_tensor(norm.offset[k]) if norm is not None else torch.zeros(dims[k])
            self.register_buffer(f"{k}_scale", scale.float().reshape(dims[k]))
            self.register_buffer(f"{k}_offset", offset.float().reshape(dims[k]))

    def normalize(self, key: str, x: Tensor) -> Tensor:
        return x * getattr(self, f"{key}_scale") + getattr(self, f"{key}_offset")

    def unnormalize(self, key: str, y: Tensor) -> Tensor:
        return (y - getattr(self, f"{key}_offset")) / getattr(self, f"{key}_scale")


class ChunkPolicy(nn.Module):
    """Base of the action-chunk policies. Subclasses implement ``loss`` and ``_sample_chunk``.

    Batches (from :class:`dmrl.data.SequenceDataset`): ``obs`` {key: (B, To, dim)}, ``action`` (B, Tp, Da),
    ``action_mask`` (B, Tp) bool. ``act`` takes one env step of observations, {key: (B, dim)} or (dim,),
    and returns (B, Da) or (Da,) actions in the env's units, clipped to [-1, 1].
    """

    name = "base"

    def __init__(self, chunk: ChunkConfig, obs_dims: dict[str, int], action_dim: int, normalizer: Normalizer | None):
        super().__init__()
        self.chunk = chunk
        self.obs_dims = {k: int(obs_dims[k]) for k in chunk.obs_keys}
        self.action_dim = action_dim
        self.normalizer = NormalizerModule(
            normalizer, (*chunk.obs_keys, "actions"), {**self.obs_dims, "actions": action_dim}
        )
        self.encoder = LowDimEncoder(self.obs_dims, chunk.n_obs_steps, chunk.encoder)
        self.reset()

    # ------------------------------------------------------------------ training side
    def encode(self, obs: dict[str, Tensor]) -> Tensor:
        """Raw obs {key: (B, To, dim)} -> condition (B, D)."""
        return self.encoder({k: self.normalizer.normalize(k, obs[k].float()) for k in self.chunk.obs_keys})

    def loss(self, batch: dict) -> dict[str, Tensor]:
        """Training losses {"loss": scalar, ...diagnostics}, computed in fp32 even under autocast."""
        raise NotImplementedError

    def forward(self, batch: dict) -> dict[str, Tensor]:
        """The same as ``loss``: calling the module is what DDP's gradient hooks and torch.compile act on."""
        return self.loss(batch)

    def _sample_chunk(self, cond: Tensor) -> Tensor:
        """cond (B, D) -> normalised action chunk (B, Tp, Da)."""
        raise NotImplementedError

    @torch.no_grad()
    def predict_chunk(self, obs: dict[str, Tensor]) -> Tensor:
        """Raw obs {key: (B, To, dim)} -> raw action chunk (B, Tp, Da), clipped to the action bounds."""
        chunk = self._sample_chunk(self.encode(obs))
        return self.normalizer.unnormalize("actions", chunk).clamp(-1.0, 1.0)

    # ------------------------------------------------------------------ acting side
    def reset(self, mask: np.ndarray | None = None) -> None:
        """Forget history and queued actions, for all envs or those where ``mask`` (B,) is True."""
        if mask is None or getattr(self, "_hist", None) is None:
            self._hist: dict[str, Tensor] | None = None
            self._queue: Tensor | None = None
            self._qpos: np.ndarray | None = None
            self._fresh: np.ndarray | None = None
            return
        self._fresh |= mask
        self._qpos[mask] = self.chunk.n_action_steps

    @torch.no_grad()
    def act(self, obs: dict) -> np.ndarray:
        single = np.asarray(obs[self.chunk.obs_keys[0]]).ndim == 1
        device = next(self.parameters()).device
        step = {k: torch.as_tensor(np.asarray(obs[k]), dtype=torch.float32, device=device) for k in self.chunk.obs_keys}
        if single:
            step = {k: v[None] for k, v in step.items()}
        b = next(iter(step.values())).shape[0]
        to, ta = self.chunk.n_obs_steps, self.chunk.n_action_steps
        if self._hist is None or next(iter(self._hist.values())).shape[0] != b:
            self._hist = {k: v[:, None].repeat(1, to, 1) for k, v in step.items()}
            self._queue = torch.zeros(b, ta, self.action_dim, device=device)
            self._qpos = np.full(b, ta)
            self._fresh = np.zeros(b, dtype=bool)
        fresh = torch.as_tensor(self._fresh, device=device)
        for k, v in step.items():
            # A fresh episode fills its history with the first frame repeated (the data's padding).
            rolled = torch.cat([self._hist[k][:, 1:], v[:, None]], dim=1)
            self._hist[k] = torch.where(fresh[:, None, None], v[:, None].expand_as(rolled), rolled)
        self._fresh[:] = False
        need = np.flatnonzero(self._qpos >= ta)
        if len(need):
            idx = torch.as_tensor(need, device=device)
            chunk = self.predict_chunk({k: h[idx] for k, h in self._hist.items()})
            # The chunk starts at the oldest observed frame: action To-1 is the one for the current step.
            self._queue[idx] = chunk[:, to - 1 : to - 1 + ta]
            self._qpos[need] = 0
        action = self._queue[torch.arange(b, device=device), torch.as_tensor(self._qpos, device=device)]
        self._qpos += 1
        out = action.cpu().numpy().astype(np.float32)
        return out[0] if single else out
