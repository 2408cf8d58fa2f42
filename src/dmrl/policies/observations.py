"""Observation keys of a policy: which encoder reads them, their geometry read off the data, and `act`'s history.

Key kinds (DESIGN.md's observation dict):

    vector   joints (J,), force (F,), state (S,) float    normalised by the policy's NormalizerModule
    frame    rgb uint8 (3V, H, W), depth float (V, H, W)  raw: the image encoders scale them themselves
    text     instruction (one string per env)             raw: tokenized inside the text encoder

``obs_dims`` (what a policy is built from and what its checkpoint stores) maps each vector key to its length and
each frame key to its per-step shape (C, H, W); text keys have no entry. Image size, cameras, J and F are read from
it, so the user never repeats what the dataset already says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch
from torch import Tensor, nn

from dmrl.models.language import LanguageConfig, LanguageEncoder
from dmrl.models.multimodal import MODALITIES, MultimodalEncoder, MultimodalEncoderConfig, MultimodalGeometry
from dmrl.models.proprio import LowDimEncoder, LowDimEncoderConfig
from dmrl.types import OBS_MODES

VECTOR_KEYS = ("joints", "force", "state")
FRAME_KEYS = ("rgb", "depth")
TEXT_KEYS = ("instruction",)
ObsDim = int | tuple[int, ...]


ENCODERS: dict[str, type] = {"lowdim": LowDimEncoderConfig, "multimodal": MultimodalEncoderConfig}
"""--chunk.encoder.type name -> the observation encoder's config class."""


class EncoderSpec(Protocol):
    """The fields of a policy's chunk config (base.ChunkConfig) that choose and shape its observation encoder.

    A protocol rather than ChunkConfig itself, so that this module does not import base.py, which imports it.
    """

    obs_keys: tuple[str, ...]
    n_obs_steps: int
    encoder: LowDimEncoderConfig | MultimodalEncoderConfig


def encoder_name(encoder: object) -> str:
    """The --chunk.encoder.type name of an encoder config (lowdim or multimodal)."""
    return next(name for name, cls in ENCODERS.items() if type(encoder) is cls)


def check_obs_keys(obs_keys: tuple[str, ...], encoder_type: str) -> None:
    """One-line ValueError for keys no encoder of ``encoder_type`` (a name of ENCODERS) can read."""
    bad = [k for k in obs_keys if k not in OBS_MODES]
    if not obs_keys or bad or len(set(obs_keys)) != len(obs_keys):
        raise ValueError(f"chunk.obs_keys: got {obs_keys}; allowed distinct names of {', '.join(OBS_MODES)}")
    if encoder_type == "lowdim":
        rich = [k for k in obs_keys if k not in VECTOR_KEYS]
        if rich:
            raise ValueError(
                f"chunk.obs_keys: {', '.join(rich)} need chunk.encoder.type multimodal "
                f"(the lowdim MLP reads only {', '.join(VECTOR_KEYS)})"
            )
    else:
        unsupported = [k for k in obs_keys if k not in MODALITIES]
        if unsupported:
            raise ValueError(
                f"chunk.obs_keys: {', '.join(unsupported)} is not read by the multimodal encoder "
                f"(allowed: {', '.join(MODALITIES)}); drop it or use chunk.encoder.type lowdim"
            )


def obs_dims_from_spec(obs_spec: Mapping[str, tuple[Sequence[int], str]], obs_keys: Sequence[str]) -> dict[str, ObsDim]:
    """An episode store's obs_spec {key: (shape, dtype)} -> obs_dims for ``obs_keys`` (see the module docstring)."""
    dims: dict[str, ObsDim] = {}
    for k in obs_keys:
        if k in TEXT_KEYS:
            continue
        shape = tuple(int(s) for s in obs_spec[k][0])
        dims[k] = tuple(shape) if k in FRAME_KEYS else int(np.prod(shape))
    return dims


def checked_obs_dims(obs_dims: Mapping[str, object], obs_keys: Sequence[str]) -> dict[str, ObsDim]:
    """obs_dims restricted to ``obs_keys`` (JSON lists become tuples); a missing or malformed entry is one line."""
    out: dict[str, ObsDim] = {}
    for k in obs_keys:
        if k in TEXT_KEYS:
            continue
        if k not in obs_dims:
            raise KeyError(f"obs_dims has no entry for {k!r} (has: {', '.join(obs_dims) or 'none'})")
        v = obs_dims[k]
        if k in FRAME_KEYS:
            if not isinstance(v, list | tuple) or len(v) != 3 or min(int(s) for s in v) < 1:
                raise ValueError(f"obs_dims[{k!r}]: got {v!r}; expected the frame shape (C, H, W)")
            out[k] = tuple(int(s) for s in v)
        else:
            if isinstance(v, list | tuple) or int(v) < 1:  # type: ignore[call-overload]
                raise ValueError(f"obs_dims[{k!r}]: got {v!r}; expected a positive vector length")
            out[k] = int(v)  # type: ignore[call-overload]
    return out


def multimodal_geometry(
    obs_keys: tuple[str, ...], n_obs_steps: int, obs_dims: Mapping[str, ObsDim]
) -> MultimodalGeometry:
    """The multimodal encoder's modalities, To, image size, cameras, J and F, from the policy's keys and obs_dims."""
    geometry: dict[str, object] = {"modalities": obs_keys, "n_obs_steps": n_obs_steps}
    frames = {k: obs_dims[k] for k in FRAME_KEYS if k in obs_keys}
    if frames:
        assert all(isinstance(s, tuple) for s in frames.values())
        if "rgb" in frames and frames["rgb"][0] % 3:  # type: ignore[index]
            raise ValueError(f"obs_dims['rgb']: got {frames['rgb']}; expected (3 * cameras, H, W)")
        cams = {k: s[0] // 3 if k == "rgb" else s[0] for k, s in frames.items()}  # type: ignore[index]
        sizes = {k: tuple(s[1:]) for k, s in frames.items()}  # type: ignore[index]
        if len(set(cams.values())) > 1 or len(set(sizes.values())) > 1:
            raise ValueError(f"obs_dims: rgb {frames['rgb']} and depth {frames['depth']} disagree on cameras or H, W")
        geometry |= {"image_size": next(iter(sizes.values())), "n_cameras": next(iter(cams.values()))}
    for k in ("joints", "force"):
        if k in obs_keys:
            geometry[f"{k}_dim"] = obs_dims[k]
    return MultimodalGeometry(**geometry)  # type: ignore[arg-type]


def build_encoder(
    chunk: EncoderSpec, obs_dims: Mapping[str, ObsDim], text_encoder: nn.Module | None = None
) -> LowDimEncoder | MultimodalEncoder:
    """The observation encoder ``chunk.encoder`` asks for, shaped by ``obs_dims``.

    lowdim: LowDimEncoder over the vector keys (normalised obs {key: (B, To, dim)} -> (B, D)). multimodal:
    MultimodalEncoder (obs -> EncoderOutput tokens (B, K, D), mask (B, K), pooled (B, D)) with the geometry read off
    the keys, To and ``obs_dims``, and a LanguageEncoder built from chunk.encoder.language when instruction is a key,
    unless ``text_encoder`` is given. A policy's action head and a critic build theirs the same way.
    """
    enc = chunk.encoder
    if isinstance(enc, LowDimEncoderConfig):
        if text_encoder is not None:
            raise ValueError("text_encoder given, but the lowdim encoder reads no instruction")
        vector_dims = {k: int(obs_dims[k]) for k in chunk.obs_keys if k in VECTOR_KEYS}  # type: ignore[call-overload]
        return LowDimEncoder(vector_dims, chunk.n_obs_steps, enc)
    geometry = multimodal_geometry(chunk.obs_keys, chunk.n_obs_steps, obs_dims)
    if "instruction" in chunk.obs_keys and text_encoder is None:
        text_encoder = LanguageEncoder(enc.language)
    given = getattr(text_encoder, "config", None)
    if isinstance(given, LanguageConfig) and given != enc.language:
        raise ValueError(
            "text_encoder: its LanguageConfig differs from chunk.encoder.language (a checkpoint would misstate it)"
        )
    return MultimodalEncoder(enc, geometry, text_encoder)


def encoder_inputs(
    obs: Mapping[str, Tensor | list[str]], obs_keys: Sequence[str], vector_keys: Sequence[str], normalizer: nn.Module
) -> dict[str, Tensor | list[str]]:
    """Raw obs {key: (B, To, ...)} -> what an observation encoder reads: the keys of ``obs_keys`` present in ``obs``
    (the multimodal encoder masks an absent one), the low-dim ``vector_keys`` normalised by ``normalizer``."""
    inputs = {k: obs[k] for k in obs_keys if k in obs}
    for k in vector_keys:
        if k in inputs:
            inputs[k] = normalizer.normalize(k, inputs[k].float())  # type: ignore[union-attr, operator]
    return inputs


def is_single(key: str, value: object) -> bool:
    """Whether one env's observation ``value`` of ``key`` comes without the batch dim (B,)."""
    if key in TEXT_KEYS:
        return isinstance(value, str)
    return np.ndim(value) == (3 if key in FRAME_KEYS else 1)


def step_tensors(obs: Mapping[str, object], keys: Sequence[str], device: torch.device) -> tuple[dict, bool]:
    """One env step {key: (B, ...) or (...)} -> ({key: (B, ...) tensor or list of B str}, single).

    uint8 stays uint8 (rgb: the ViT scales it; a quarter of float32's memory in the history), the rest is float32.
    """
    single = is_single(keys[0], obs[keys[0]])
    step: dict[str, Tensor | list[str]] = {}
    for k in keys:
        v = obs[k]
        if k in TEXT_KEYS:
            step[k] = [str(v)] if single else [str(s) for s in v]  # type: ignore[attr-defined]
            continue
        t = torch.as_tensor(np.asarray(v), device=device)
        t = t if t.dtype == torch.uint8 else t.float()
        step[k] = t[None] if single else t
    return step, single


def roll_history(
    hist: dict[str, Tensor | list[str]] | None, step: dict[str, Tensor | list[str]], fresh: Tensor, n_obs_steps: int
) -> dict[str, Tensor | list[str]]:
    """Append one step to the To-frame history {key: (B, To, ...)}; text keeps only the latest string per env.

    ``hist`` None starts every env fresh. An env flagged in ``fresh`` (B,) bool fills its whole history with this
    frame (the dataset's first-frame padding). An instruction is constant within an episode, so the newest string
    is the whole history, and a reset env's new instruction replaces the old one on its first step.
    """
    out: dict[str, Tensor | list[str]] = {}
    for k, v in step.items():
        if isinstance(v, list):
            out[k] = list(v)
            continue
        frames = v[:, None].expand(v.shape[0], n_obs_steps, *v.shape[1:])
        if hist is None:
            out[k] = frames.clone()
            continue
        rolled = torch.cat([hist[k][:, 1:], v[:, None]], dim=1)  # type: ignore[index]
        out[k] = torch.where(fresh.view(-1, *([1] * (rolled.ndim - 1))), frames, rolled)
    return out


def select(hist: Mapping[str, Tensor | list[str]], idx: np.ndarray) -> dict[str, Tensor | list[str]]:
    """The envs ``idx`` (n,) of a history or batch: tensors indexed on dim 0, text lists picked."""
    return {
        k: [v[i] for i in idx.tolist()] if isinstance(v, list) else v[torch.as_tensor(idx, device=v.device)]
        for k, v in hist.items()
    }
