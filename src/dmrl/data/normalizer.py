"""Per-key affine normalisation as in Diffusion Policy's LinearNormalizer: `limits` to [-1, 1] or `gaussian`.

Every key stores y = x * scale + offset, with `scale`/`offset` shaped to broadcast over the trailing dims
of a step: (D,) for low-dim keys (actions, state, joints, force) and (C, 1, 1) for images.

  limits    per-dim min/max -> [-1, 1]. A dim whose range is below `eps` (constant in the data) gets
            scale 1 and maps its constant value to 0, so it never divides by ~0 (as Diffusion Policy does).
  gaussian  per-dim (x - mean) / std; std below `eps` is treated as 1.
  fixed     rgb (uint8): x * 2/255 - 1, never fitted (no pass over the images is needed).

depth (float metres) is fitted like a low-dim key but with one range per channel over all pixels, streamed
over store chunks; per-pixel statistics would make a wall's far corner look like an outlier.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from dmrl.data.nonfinite import check_rows

if TYPE_CHECKING:
    from dmrl.data.episodes import EpisodeStore

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)
FIT_MODES = ("limits", "gaussian")
FIXED_KEYS = ("rgb",)


class MissingStatError(KeyError):
    """A normalizer key or state_dict entry that is not there; prints as one plain line."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class Normalizer:
    """Per-key affine maps. `scale[k]`, `offset[k]` float32, broadcast over the trailing dims of key k."""

    scale: dict[str, np.ndarray] = field(default_factory=dict)
    offset: dict[str, np.ndarray] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)
    _torch: dict[tuple[str, str, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.scale)

    def __contains__(self, key: str) -> bool:
        return key in self.scale

    def set(self, key: str, scale: np.ndarray, offset: np.ndarray, mode: str) -> None:
        """Add or replace key `key`."""
        self.scale[key] = np.asarray(scale, dtype=np.float32)
        self.offset[key] = np.asarray(offset, dtype=np.float32)
        self.modes[key] = mode
        self._torch = {k: v for k, v in self._torch.items() if k[0] != key}

    # ------------------------------------------------------------------ apply
    def normalize(self, key: str, x: ArrayT) -> ArrayT:
        """(..., *step_shape) -> same shape; float in -> same dtype out, integer (rgb uint8) -> float32."""
        scale, offset = self._params(key, x)
        return x * scale + offset  # type: ignore[return-value]

    def unnormalize(self, key: str, x: ArrayT) -> ArrayT:
        """Inverse of `normalize` (always a float result)."""
        scale, offset = self._params(key, x)
        return (x - offset) / scale  # type: ignore[return-value]

    def _params(self, key: str, x: Any) -> tuple[Any, Any]:
        if key not in self.scale:
            raise MissingStatError(
                f"normalizer has no stats for {key!r} (has: {', '.join(self.keys) or 'none'}); "
                f"fit it with keys including {key}"
            )
        s = self.scale[key]
        tail = tuple(x.shape[x.ndim - s.ndim :]) if x.ndim >= s.ndim else None
        if tail is None or any(b not in (1, a) for a, b in zip(tail, s.shape, strict=True)):
            raise ValueError(f"normalizer[{key!r}]: stats shaped {s.shape} do not fit input {tuple(x.shape)}")
        if isinstance(x, torch.Tensor):
            dtype = x.dtype if x.is_floating_point() else torch.float32
            cache_key = (key, str(x.device), dtype)
            if cache_key not in self._torch:  # avoid a host->device copy on every policy step
                self._torch[cache_key] = (
                    torch.as_tensor(s, dtype=dtype, device=x.device),
                    torch.as_tensor(self.offset[key], dtype=dtype, device=x.device),
                )
            return self._torch[cache_key]
        dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float32
        return s.astype(dtype, copy=False), self.offset[key].astype(dtype, copy=False)

    # ------------------------------------------------------------------ serialisation
    def state_dict(self) -> dict[str, np.ndarray]:
        """Flat {"<key>.scale": array, "<key>.offset": array}, ready for safetensors."""
        out: dict[str, np.ndarray] = {}
        for k in self.keys:
            out[f"{k}.scale"] = self.scale[k].copy()
            out[f"{k}.offset"] = self.offset[k].copy()
        return out

    @classmethod
    def from_state_dict(
        cls,
        state: dict[str, Any],
        keys: tuple[str, ...] | list[str] | None = None,
        modes: dict[str, str] | None = None,
    ) -> Normalizer:
        """Inverse of `state_dict` (numpy arrays or tensors); a missing entry raises an error naming it."""
        if keys is None:
            keys = sorted({name.rsplit(".", 1)[0] for name in state if name.rsplit(".", 1)[-1] in ("scale", "offset")})
        norm = cls()
        for k in keys:
            for part in ("scale", "offset"):
                if f"{k}.{part}" not in state:
                    raise MissingStatError(
                        f"normalizer state_dict: missing key '{k}.{part}' (have: {', '.join(sorted(state)) or 'none'})"
                    )
            arrays = [state[f"{k}.{p}"] for p in ("scale", "offset")]
            arrays = [a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a) for a in arrays]
            norm.set(k, arrays[0], arrays[1], (modes or {}).get(k, "unknown"))
        return norm

    def to_json(self) -> str:
        doc = {
            "format": 1,
            "keys": {
                k: {"mode": self.modes[k], "scale": self.scale[k].tolist(), "offset": self.offset[k].tolist()}
                for k in self.keys
            },
        }
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> Normalizer:
        doc = json.loads(text)
        norm = cls()
        for k, v in doc["keys"].items():
            norm.set(k, np.asarray(v["scale"]), np.asarray(v["offset"]), v["mode"])
        return norm

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, arrays: dict[str, np.ndarray], mode: str = "limits", eps: float = 1e-4) -> Normalizer:
        """Fit from in-memory arrays {key: (N, *step_shape)}; `rgb` gets the fixed uint8 map."""
        norm = cls()
        for key, x in arrays.items():
            if key in FIXED_KEYS:
                norm.set(key, *fixed_rgb(x.shape[1]), "fixed")
                continue
            stats = RunningStats(x.shape[1:])
            stats.update(x)
            norm.set(key, *stats.affine(mode, eps), mode)
        return norm


def fixed_rgb(channels: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """uint8 [0, 255] -> [-1, 1] for (C, H, W) images: scale, offset shaped (C, 1, 1)."""
    return np.full((channels, 1, 1), 2.0 / 255.0, np.float32), np.full((channels, 1, 1), -1.0, np.float32)


class RunningStats:
    """Streaming min/max/mean/var (Chan et al. parallel merge) over rows; images reduce to one per channel."""

    def __init__(self, step_shape: tuple[int, ...]) -> None:
        # (C, H, W) steps reduce over H, W too: stats keep shape (C, 1, 1).
        self.axes = (0, *range(2, len(step_shape) + 1)) if len(step_shape) >= 2 else (0,)
        self.count = 0
        self.min: np.ndarray | None = None
        self.max: np.ndarray | None = None
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None

    def update(self, x: np.ndarray) -> None:
        """Fold in a block of rows (n, *step_shape)."""
        if len(x) == 0:
            return
        x = np.asarray(x, dtype=np.float64)
        n = int(np.prod([x.shape[a] for a in self.axes]))
        lo, hi = x.min(axis=self.axes), x.max(axis=self.axes)
        mean_kept = x.mean(axis=self.axes, keepdims=True)
        m2 = ((x - mean_kept) ** 2).sum(axis=self.axes)
        mean = np.squeeze(mean_kept, axis=self.axes)
        if self.mean is None:
            self.min, self.max, self.mean, self.m2, self.count = lo, hi, mean, m2, n
            return
        assert self.min is not None and self.max is not None and self.m2 is not None
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * n / total
        self.m2 = self.m2 + m2 + delta**2 * self.count * n / total
        self.min, self.max, self.count = np.minimum(self.min, lo), np.maximum(self.max, hi), total

    def affine(self, mode: str, eps: float) -> tuple[np.ndarray, np.ndarray]:
        """(scale, offset) mapping the data seen so far per `mode`."""
        if mode not in FIT_MODES:
            raise ValueError(f"normalizer mode: got {mode!r}; allowed values are {', '.join(FIT_MODES)}")
        if self.mean is None or self.min is None or self.max is None or self.m2 is None:
            raise ValueError("normalizer: cannot fit on zero rows")
        shape = self._stat_shape()
        if mode == "limits":
            rng = self.max - self.min
            flat = rng < eps
            scale = np.where(flat, 1.0, 2.0 / np.where(flat, 1.0, rng))
            offset = np.where(flat, -self.min, -1.0 - self.min * scale)
        else:
            std = np.sqrt(self.m2 / self.count)
            scale = 1.0 / np.where(std < eps, 1.0, std)
            offset = -self.mean * scale
        return scale.reshape(shape), offset.reshape(shape)

    def _stat_shape(self) -> tuple[int, ...]:
        assert self.mean is not None
        if len(self.axes) > 1:  # image: (C,) -> (C, 1, 1, ...)
            return (*self.mean.shape, *([1] * (len(self.axes) - 1)))
        return self.mean.shape


def fit_normalizer(
    store: EpisodeStore, keys: tuple[str, ...] | list[str], mode: str = "limits", eps: float = 1e-4
) -> Normalizer:
    """Fit `keys` (modalities and/or "actions") over the store's committed steps, one chunk at a time.

    A NaN or ±inf in a fitted key raises `NonFiniteError` naming the key and its first bad episode and step: the
    statistics (and every batch they normalise) would be non-finite.
    """
    norm = Normalizer()
    for key in keys:
        arr = store.array(key)  # StoreError naming the modality if the store lacks it
        if key in FIXED_KEYS:
            norm.set(key, *fixed_rgb(arr.shape[1]), "fixed")
            continue
        stats = RunningStats(tuple(arr.shape[1:]))
        block = int(arr.chunks[0])
        for start in range(0, store.n_steps, block):
            rows = np.asarray(arr[start : min(start + block, store.n_steps)])
            check_rows(store, key, rows, start)  # the block is in memory already: one isfinite pass
            stats.update(rows)
        norm.set(key, *stats.affine(mode, eps), mode)
    return norm
