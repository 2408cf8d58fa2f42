"""What every policy shares: normalisation inside the module, the observation encoder, To-frame history and a
Ta-step action queue.

A policy maps raw observations to raw actions: statistics are buffers of the module, so they travel in
the checkpoint and ``act`` needs nothing else (Diffusion Policy's interface, receding-horizon execution).
Only vector keys (joints, force, state) and actions are normalised here: rgb goes to the ViT / ResNet as uint8
(they scale to [0, 1] and apply their own mean/std), depth in metres goes to the DepthEncoder (it clamps and
rescales), and instructions are tokenized by the text encoder. Normalising them here as well would do it twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from dmrl.config_utils import choice
from dmrl.data import Normalizer
from dmrl.models.multimodal import EncoderOutput, MultimodalEncoder
from dmrl.models.proprio import LowDimEncoder
from dmrl.policies.observations import (
    ENCODERS,
    VECTOR_KEYS,
    ObsDim,
    build_encoder,
    check_obs_keys,
    checked_obs_dims,
    encoder_inputs,
    encoder_name,
    roll_history,
    select,
    step_tensors,
)

E = TypeVar("E")


@dataclass
class ChunkConfig(Generic[E]):
    """Observation/action horizons, the observation keys and their encoder (shared by all policies)."""

    obs_keys: tuple[str, ...] = ("state",)
    """Observation keys the policy reads: joints, force, state (lowdim); rgb, depth, joints, force, instruction
    (multimodal)."""
    n_obs_steps: int = 2
    """To: observation frames the policy conditions on."""
    horizon: int = 16
    """Tp: actions predicted per chunk."""
    n_action_steps: int = 8
    """Ta: actions executed from each chunk before replanning (receding horizon)."""
    encoder: E = choice(ENCODERS, "lowdim")
    """The observation encoder (--chunk.encoder.type lowdim | multimodal): lowdim, an MLP over the concatenated
    vector keys; multimodal, per-modality tokens fused by a Perceiver (and MiniLM when instruction is a key)."""
    aux_state: tuple[int, ...] = ()
    """Training only: indices of the dataset's privileged ``state`` vector that a linear head predicts from the
    pooled condition at the current frame (an auxiliary loss that tells the encoder what to find, e.g. the named
    cup's position, 7 8 9 in MultiPath). The policy never reads state: evaluation and export ignore the head."""
    aux_weight: float = 1.0
    """Weight of the auxiliary loss (MSE on the normalised state entries) added to the policy's loss."""
    pad_after: int | None = None
    """Training windows: how many steps a window's actions may run past its episode's end (padded and masked from
    the loss). None: Ta - 1, Diffusion Policy's convention, under which the last Tp - To - Ta + 1 steps of an
    episode are never a current step; Tp - To: every step is (see data.sequence). Evaluation ignores it."""

    @property
    def encoder_type(self) -> str:
        """The encoder's --chunk.encoder.type name: lowdim or multimodal."""
        return encoder_name(self.encoder)

    def __post_init__(self) -> None:
        self.obs_keys = tuple(self.obs_keys)
        self.aux_state = tuple(int(i) for i in self.aux_state)
        if type(self.encoder) not in ENCODERS.values():
            raise ValueError(f"chunk.encoder: got {type(self.encoder).__name__}; allowed: {', '.join(ENCODERS)}")
        check_obs_keys(self.obs_keys, self.encoder_type)
        if "state" in self.obs_keys and self.aux_state:
            raise ValueError("chunk.aux_state: the policy already reads state; an auxiliary state loss needs it absent")
        if any(i < 0 for i in self.aux_state) or len(set(self.aux_state)) != len(self.aux_state):
            raise ValueError(f"chunk.aux_state: got {list(self.aux_state)}; allowed distinct indices >= 0")
        if not self.aux_weight >= 0.0:
            raise ValueError(f"chunk.aux_weight: got {self.aux_weight}; allowed >= 0")
        if self.pad_after is not None and not 0 <= self.pad_after <= self.horizon - self.n_obs_steps:
            raise ValueError(
                f"chunk.pad_after: got {self.pad_after}; allowed null (Ta - 1) or 0 .. Tp - To = "
                f"{self.horizon - self.n_obs_steps}"
            )
        ti = getattr(self.encoder, "image_obs_steps", None)
        if ti is not None and ti > self.n_obs_steps:
            raise ValueError(
                f"chunk.encoder.image_obs_steps: got {ti}; allowed at most chunk.n_obs_steps = {self.n_obs_steps}"
            )
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


def action_bounds(normalizer: NormalizerModule) -> tuple[Tensor, Tensor]:
    """(Da,) low and high of raw actions under ``normalizer``: [-1, 1] widened per dim to the range its action
    statistics map onto [-1, 1] (see ChunkPolicy.action_bounds)."""
    ones = torch.ones_like(normalizer.actions_scale)
    a, b = normalizer.unnormalize("actions", -ones), normalizer.unnormalize("actions", ones)
    return torch.minimum(torch.minimum(a, b), -ones), torch.maximum(torch.maximum(a, b), ones)


def raw_actions(normalizer: NormalizerModule, chunk: Tensor) -> Tensor:
    """Normalised chunk (B, Tp, Da) -> raw actions, clipped to ``action_bounds(normalizer)``: what every planner
    (torch, best-of-N, a one-step student, an exported graph, the policy server) hands to the env."""
    low, high = action_bounds(normalizer)
    return normalizer.unnormalize("actions", chunk).clamp(low, high)


class ChunkPolicy(nn.Module):
    """Base of the action-chunk policies. Subclasses implement ``loss`` and ``sample_chunk``.

    Batches (from :class:`dmrl.data.SequenceDataset`): ``obs`` {key: (B, To, ...)} raw (rgb uint8 (B, To, 3V, H, W),
    depth (B, To, V, H, W) metres, vectors (B, To, dim), instruction a list of B str), ``action`` (B, Tp, Da),
    ``action_mask`` (B, Tp) bool. ``act`` takes one env step of observations, {key: (B, ...)} or unbatched, and
    returns (B, Da) or (Da,) actions in the env's units, clipped to ``action_bounds()``.

    obs_dims: {vector key: length, frame key: (C, H, W)} (see policies.observations); text_encoder: a prebuilt
    LanguageEncoder(chunk.encoder.language) to use instead of building one (it is slow to load; tests share one).
    """

    name = "base"

    def __init__(
        self,
        chunk: ChunkConfig,
        obs_dims: Mapping[str, ObsDim],
        action_dim: int,
        normalizer: Normalizer | None,
        text_encoder: nn.Module | None = None,
    ):
        super().__init__()
        self.obs_dims = checked_obs_dims(obs_dims, chunk.obs_keys)
        self.action_dim = action_dim
        self.vector_keys = tuple(k for k in chunk.obs_keys if k in VECTOR_KEYS)
        vector_dims = {k: int(self.obs_dims[k]) for k in self.vector_keys}  # type: ignore[call-overload]
        self.normalizer = NormalizerModule(
            normalizer, (*self.vector_keys, "actions"), {**vector_dims, "actions": action_dim}
        )
        # The multimodal geometry is read off obs_dims (stored in the checkpoint next to chunk), never configured.
        self.encoder: LowDimEncoder | MultimodalEncoder = build_encoder(chunk, self.obs_dims, text_encoder)
        self.chunk = chunk
        self.aux_head = self._build_aux_head(normalizer) if chunk.aux_state else None
        self._planner: Callable[[Mapping[str, Tensor | list[str]]], Tensor] | None = None
        self._actions = ActionQueue()

    def _build_aux_head(self, norm: Normalizer | None) -> nn.Linear:
        """Linear pooled (B, D) -> normalised state[aux_state] (B, n); its statistics are buffers like the rest."""
        idx = list(self.chunk.aux_state)
        if norm is not None:
            if "state" not in norm:
                raise KeyError("chunk.aux_state: the normalizer has no 'state' statistics; fit it with state")
            scale, offset = (np.asarray(v, np.float32).reshape(-1) for v in (norm.scale["state"], norm.offset["state"]))
            if max(idx) >= len(scale):
                raise ValueError(f"chunk.aux_state: index {max(idx)} out of range; the state has {len(scale)} entries")
            scale, offset = scale[idx], offset[idx]
        else:  # loaded from a checkpoint: the buffers come with the weights
            scale, offset = np.ones(len(idx), np.float32), np.zeros(len(idx), np.float32)
        self.register_buffer("aux_scale", torch.as_tensor(scale))
        self.register_buffer("aux_offset", torch.as_tensor(offset))
        return nn.Linear(self.encoder.out_dim, len(idx))

    def aux_loss(self, batch: dict, pooled: Tensor) -> Tensor | None:
        """MSE of the auxiliary head on batch["obs"]["state"] (B, To, S) at the current frame; None without one."""
        if self.aux_head is None:
            return None
        state = batch["obs"].get("state")
        if state is None:
            raise KeyError("chunk.aux_state: the training batch has no obs 'state'; use a store collected with state")
        target = state[:, -1, list(self.chunk.aux_state)].float() * self.aux_scale + self.aux_offset
        return ((self.aux_head(pooled).float() - target) ** 2).mean()

    def _add_aux(self, out: dict[str, Tensor], batch: dict, pooled: Tensor) -> dict[str, Tensor]:
        """``out`` with the weighted auxiliary loss added to "loss" (and logged as "aux") when configured."""
        aux = self.aux_loss(batch, pooled)
        if aux is None:
            return out
        return out | {"loss": out["loss"] + self.chunk.aux_weight * aux, "aux": aux.detach()}

    def set_planner(self, planner: Callable[[Mapping[str, Tensor | list[str]]], Tensor] | None) -> None:
        """Plan chunks in ``act`` with ``planner(obs {key: (B, To, ...)}) -> raw chunk (B, Tp, Da)`` instead of
        ``predict_chunk`` (e.g. an exported graph, :class:`dmrl.export.OnnxPlanner`); None restores torch."""
        self._planner = planner

    # ------------------------------------------------------------------ training side
    def encode_tokens(self, obs: Mapping[str, Tensor | list[str]]) -> EncoderOutput:
        """Raw obs {key: (B, To, ...)} -> EncoderOutput: tokens (B, K, D), mask (B, K), pooled (B, D).

        The lowdim encoder gives K = 1 (its vector as the single token) and needs every key. The multimodal encoder
        masks a key absent from ``obs`` (a dropped modality) instead of reading it as zeros.
        """
        inputs = encoder_inputs(obs, self.chunk.obs_keys, self.vector_keys, self.normalizer)
        if isinstance(self.encoder, LowDimEncoder):
            cond = self.encoder(inputs)
            return EncoderOutput(cond[:, None], cond.new_ones(cond.shape[0], 1, dtype=torch.bool), cond, {})
        return self.encoder(inputs)

    def encode(self, obs: Mapping[str, Tensor | list[str]]) -> Tensor:
        """Raw obs {key: (B, To, ...)} -> pooled condition (B, D)."""
        return self.encode_tokens(obs).pooled

    def condition(self, obs: Mapping[str, Tensor | list[str]]) -> tuple[Tensor, Tensor | None]:
        """Raw obs -> what the action head reads: (cond (B, D), None) here; token policies return (B, K, D), mask."""
        return self.encode(obs), None

    def loss(self, batch: dict) -> dict[str, Tensor]:
        """Training losses {"loss": scalar, ...diagnostics}, computed in fp32 even under autocast."""
        raise NotImplementedError

    def forward(self, batch: dict) -> dict[str, Tensor]:
        """The same as ``loss``: calling the module is what DDP's gradient hooks and torch.compile act on."""
        return self.loss(batch)

    def sample_chunk(
        self,
        cond: Tensor,
        cond_mask: Tensor | None = None,
        grad_steps: int = 0,
        *,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """cond (B, D) or (B, K, D), cond_mask (B, K) bool or None -> normalised action chunk (B, Tp, Da).

        ``grad_steps``: how many of the final sampling steps carry gradients: 0 none (the whole sample runs under
        no_grad), up to the number of steps (all; a diffusion policy's S, 1 for a one-shot Gaussian or VAE head).
        Gradients flow only where the caller has them enabled. ``generator``: the sample's randomness (None: torch's
        global RNG); the same generator state gives the same chunk whatever ``grad_steps`` is.
        """
        raise NotImplementedError

    # inference_mode, not no_grad: no autograd bookkeeping at all, ~20% less time per DDIM-10 chunk at batch 1
    # (an ad-hoc timing: 3.9 -> 3.1 ms, 256x2 MLP, one thread). Its outputs cannot enter autograd later; training code
    # calls sample_chunk instead.
    @torch.inference_mode()
    def predict_chunk(self, obs: Mapping[str, Tensor | list[str]]) -> Tensor:
        """Raw obs {key: (B, To, ...)} -> raw action chunk (B, Tp, Da), clipped to the action bounds."""
        return self.raw_actions(self.sample_chunk(*self.condition(obs)))

    def raw_actions(self, chunk: Tensor) -> Tensor:
        """Normalised chunk (B, Tp, Da) -> raw actions in the env's units, clipped to ``action_bounds()``."""
        return raw_actions(self.normalizer, chunk)

    def action_bounds(self) -> tuple[Tensor, Tensor]:
        """(Da,) low and high of raw actions: [-1, 1] (dmrl's envs), widened per dim to the range the action normaliser
        maps onto [-1, 1] (the training data's min / max, in the checkpoint's buffers), so that actions recorded in a
        robot's own units (dmrl data import) are not cut at 1."""
        return action_bounds(self.normalizer)

    # ------------------------------------------------------------------ acting side
    def reset(self, mask: np.ndarray | None = None) -> None:
        """Forget history and queued actions, for all envs or those where ``mask`` (B,) is True."""
        self._actions.reset(mask)

    @torch.inference_mode()
    def act(self, obs: Mapping[str, object]) -> np.ndarray:
        """One env step {key: (B, ...)} or unbatched -> actions (B, Da) or (Da,), in the env's units.

        Receding-horizon execution, as in Diffusion Policy: each env keeps its last To observation frames and a
        queue of Ta actions. When an env's queue is empty, ``predict_chunk`` (or the planner of ``set_planner``)
        plans Tp actions from its To frames; the chunk starts at the oldest frame, so its action To - 1 belongs to
        the current step, and actions To - 1 .. To + Ta - 2 fill the queue. With n the step that plans::

            (To observation frames, Tp predicted actions, Ta executed actions)
            env step           n-To+1 ... n-1   n   n+1 ... n+Ta-1   n+Ta ... n-To+Tp
            observation read     yes  ... yes  yes   -  ...   -        -  ...    -
            action predicted     yes  ... yes  yes  yes ...  yes      yes ...   yes
            action executed       -   ...  -   yes  yes ...  yes       -  ...    -
                                                                     ^ queue empty: the next plan, here

        e.g. To 2, Tp 16, Ta 8: a plan at step n reads frames n-1 and n, predicts steps n-1 .. n+14, executes
        n .. n+7 and plans again at n+8. An env starts afresh (its history padded with its first frame, as the
        training windows are) at its first step, after ``reset``, and when the batch size or the keys change.
        Keys missing from ``obs`` are left out (a multimodal policy masks them; the lowdim one raises).
        """
        plan = self._planner if self._planner is not None else self.predict_chunk
        return self._actions.step(obs, self.chunk, self.action_dim, next(self.parameters()).device, plan)


class ActionQueue:
    """Acting state of B envs, for :meth:`ChunkPolicy.act`: the last To observation frames of each env and what is
    left of its current chunk's Ta actions. Plain tensors, no weights: a policy and a wrapper around it (best-of-N
    with a critic) each own one, so two of them never share a queue."""

    def __init__(self) -> None:
        self.reset()

    def reset(self, mask: np.ndarray | None = None) -> None:
        """Forget everything (mask None) or restart the envs where ``mask`` (B,) is True at their next step."""
        if mask is None or getattr(self, "hist", None) is None:
            self.hist: dict[str, Tensor | list[str]] | None = None  # {key: (B, To, ...)} raw
            self.queue: Tensor | None = None  # (B, Ta, Da) raw actions
            self.pos: np.ndarray | None = None  # (B,) next queue index of each env; Ta: empty, plan at this step
            self.fresh: np.ndarray | None = None  # (B,) bool: restart the history at the next step
            return
        assert self.queue is not None and self.pos is not None and self.fresh is not None
        self.fresh |= mask
        self.pos[mask] = self.queue.shape[1]

    def step(
        self,
        obs: Mapping[str, object],
        chunk: ChunkConfig,
        action_dim: int,
        device: torch.device,
        plan: Callable[[Mapping[str, Tensor | list[str]]], Tensor],
    ) -> np.ndarray:
        """One env step {key: (B, ...)} or unbatched -> actions (B, Da) or (Da,); ``plan(obs {key: (B', To, ...)})
        -> raw chunk (B', Tp, Da)`` is called for the B' envs whose queue is empty."""
        keys = [k for k in chunk.obs_keys if k in obs]
        if not keys:
            raise KeyError(f"act: obs has none of the policy's keys {list(chunk.obs_keys)}; got {sorted(obs)}")
        step, single = step_tensors(obs, keys, device)
        first = step[keys[0]]
        b = len(first) if isinstance(first, list) else first.shape[0]
        to, ta = chunk.n_obs_steps, chunk.n_action_steps
        if self.hist is None or self.pos is None or len(self.pos) != b or set(self.hist) != set(step):
            self.hist = None  # new batch size or key set: every env starts a fresh history
            self.queue = torch.zeros(b, ta, action_dim, device=device)
            self.pos = np.full(b, ta)
            self.fresh = np.zeros(b, dtype=bool)
        assert self.queue is not None and self.fresh is not None
        self.hist = roll_history(self.hist, step, torch.as_tensor(self.fresh, device=device), to)
        self.fresh[:] = False
        need = np.flatnonzero(self.pos >= ta)
        if len(need):
            planned = plan(select(self.hist, need)).to(device)
            # The chunk starts at the oldest observed frame: action To-1 is the one for the current step.
            self.queue[torch.as_tensor(need, device=device)] = planned[:, to - 1 : to - 1 + ta]
            self.pos[need] = 0
        action = self.queue[torch.arange(b, device=device), torch.as_tensor(self.pos, device=device)]
        self.pos += 1
        out = action.cpu().numpy().astype(np.float32)
        return out[0] if single else out
