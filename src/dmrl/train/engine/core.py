"""The training engine every trainer uses: device, precision + loss scaling, accumulation, clipping, DDP, compile.

An algorithm's step reads::

    model = engine.prepare(policy)                      # moved, checkpointing switched, compiled, DDP-wrapped
    logs = engine.backward(model, batch)                # batch split into engine.cfg.accumulate micro-batches
    stats = engine.step(optimizer)                      # unscale, clip, step (or skip on inf/nan), zero grads

so no algorithm carries device, precision, accumulation or distributed code of its own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dmrl.train.engine.device import (
    DEVICE_KINDS,
    PRECISIONS,
    autocast,
    configure_cpu_threads,
    resolve_device,
    resolve_precision,
    seed_everything,
    set_deterministic,
)
from dmrl.train.engine.distributed import all_reduce_mean, dist_info_from_env, init_distributed


@dataclass
class EngineConfig:
    """Device, precision, clipping, accumulation, parallelism and state checkpoints of a training run."""

    device: str = "auto"
    """auto, cpu, cuda[:i] or npu[:i]."""
    precision: str = "auto"
    """auto, fp32, bf16 or fp16."""
    grad_clip: float = 1.0
    """Max global gradient norm (0: off)."""
    accumulate: int = 1
    """Micro-batches per optimizer step."""
    grad_checkpointing: bool = False
    """Activation checkpointing."""
    compile: bool = False
    """torch.compile the policy."""
    deterministic: bool = False
    """Deterministic kernels."""
    cpu_threads: int = 1
    """torch intra-op threads on CPU."""
    save_every: int = 1000
    """Steps between training states."""
    keep_last: int = 2
    """Training states kept on disk."""
    loss_scale: float = 2.0**15
    """fp16: initial loss scale."""

    def __post_init__(self) -> None:
        kind, _, index = self.device.partition(":")
        if self.device != "auto" and (kind not in DEVICE_KINDS or (index and not index.isdigit())):
            raise ValueError(f"--engine.device: got {self.device!r}; allowed: auto, cpu, cuda[:i], npu[:i]")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--engine.precision: got {self.precision!r}; allowed: {', '.join(PRECISIONS)}")
        if self.grad_clip < 0 or self.accumulate < 1 or self.cpu_threads < 1:
            raise ValueError(
                f"engine: need grad_clip >= 0, accumulate >= 1, cpu_threads >= 1; got {self.grad_clip}, "
                f"{self.accumulate}, {self.cpu_threads}"
            )
        if self.save_every < 0 or self.keep_last < 1 or self.loss_scale <= 0:
            raise ValueError(
                f"engine: need save_every >= 0, keep_last >= 1, loss_scale > 0; got {self.save_every}, "
                f"{self.keep_last}, {self.loss_scale}"
            )


def set_grad_checkpointing(model: nn.Module, on: bool) -> int:
    """Switch activation checkpointing on every sub-module that supports it; returns how many there are."""
    n = 0
    for m in model.modules():
        if hasattr(m, "grad_checkpointing"):
            m.grad_checkpointing = on
            n += 1
    return n


def compile_submodules(model: nn.Module, skip: tuple[str, ...] = ("normalizer",)) -> list[str]:
    """torch.compile each direct child network in place (state_dict keys unchanged); returns their names."""
    names = []
    for name, child in model.named_children():
        if name not in skip and any(True for _ in child.parameters()):
            child.compile(dynamic=False)
            names.append(name)
    return names


class Engine:
    """One process's view of a training run. Construct once, before the model, so seeds and devices are set."""

    def __init__(self, cfg: EngineConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.dist = dist_info_from_env()
        self.device = resolve_device(cfg.device, self.dist.local_rank if self.dist.enabled else None)
        self.precision = resolve_precision(cfg.precision, self.device)
        if self.device.type == "cpu":
            configure_cpu_threads(cfg.cpu_threads)
        if cfg.deterministic:
            set_deterministic(True)
        init_distributed(self.dist, self.device)
        self.seed = seed + self.dist.rank  # per-rank noise draws; data order is shared (GlobalBatchSampler)
        seed_everything(self.seed)
        # Enabled only for fp16: bf16 has fp32's exponent range and needs no scaling. torch_npu registers the
        # "npu" device type, so the same class is its scaler.
        self.scaler = torch.amp.GradScaler(
            self.device.type,
            init_scale=cfg.loss_scale,
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=2000,
            enabled=self.precision == "fp16",
        )
        self._params: list[Tensor] = []

    # ------------------------------------------------------------------ set-up
    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    @property
    def pin_memory(self) -> bool:
        """Page-locked host batches: faster copies to an accelerator, pointless on CPU."""
        return self.device.type != "cpu"

    @property
    def worker_start_method(self) -> str | None:
        """Start method for DataLoader workers: spawn on NPU (torch_npu does not survive fork), else the default."""
        return "spawn" if self.device.type == "npu" else None

    def prepare(self, model: nn.Module) -> nn.Module:
        """Move ``model`` to the device, apply checkpointing / compile, wrap in DDP when distributed.

        Returns what the trainer calls for losses: ``module(batch) -> {"loss": ..., ...}``; keep using the
        unwrapped ``model`` for EMA, evaluation and saving.
        """
        model.to(self.device)
        if self.cfg.grad_checkpointing and set_grad_checkpointing(model, True) == 0:
            raise ValueError("--engine.grad-checkpointing: this model has no blocks that support checkpointing")
        if self.cfg.compile:
            compile_submodules(model)
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self.dist.enabled:
            return model
        # Normaliser statistics are buffers fixed before training: no need to re-broadcast them every step.
        ids = [self.device.index] if self.device.type != "cpu" else None
        return DDP(model, device_ids=ids, broadcast_buffers=False)

    # ------------------------------------------------------------------ one optimizer step
    def backward(self, loss_fn: Callable[[dict], dict[str, Tensor]], batch: dict) -> dict[str, Tensor]:
        """Gradients of one step: ``batch`` (this rank's share of the step, B items) is split into
        ``cfg.accumulate`` micro-batches, each forwarded under autocast and backwarded (see forward_backward).

        ``loss_fn(micro_batch) -> {"loss": scalar, ...}`` (a prepared module or an algorithm's loss method).
        Returns its outputs, detached: scalars averaged over the micro-batches (tensors: no device sync), per-item
        outputs (b,) concatenated in batch order into (B,).
        """
        micro = split_batch(batch, self.cfg.accumulate)
        logs: dict[str, Tensor] = {}
        per_item: dict[str, list[Tensor]] = {}
        for k, mb in enumerate(micro):
            out = self.forward_backward(loss_fn, mb, last=k == len(micro) - 1)
            for name, v in out.items():
                if v.ndim == 0:
                    logs[name] = logs.get(name, 0.0) + v.detach() / len(micro)
                else:
                    per_item.setdefault(name, []).append(v.detach())
        return logs | {name: torch.cat(parts) for name, parts in per_item.items()}

    def forward_backward(self, module: Callable[[dict], dict], batch: dict, last: bool = True) -> dict[str, Tensor]:
        """Loss of one micro-batch under autocast, backward of loss / accumulate (scaled for fp16).

        ``last=False`` skips DDP's gradient all-reduce (``no_sync``): only the final micro-batch of a step
        communicates, and the summed gradients equal those of one batch ``accumulate`` times larger.
        """
        sync = contextlib.nullcontext()
        if isinstance(module, DDP) and not last:
            sync = module.no_sync()
        with sync:
            with autocast(self.device, self.precision):
                losses = module(batch)
            loss = losses["loss"].float() / self.cfg.accumulate
            self.scaler.scale(loss).backward()
        return losses

    def step(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Unscale, clip to ``grad_clip``, step (skipped by the scaler on inf/nan grads), zero the grads.

        Returns {"grad_norm": tensor (pre-clip), "skipped": bool, "loss_scale": float}. ``skipped`` is only
        ever True with fp16, where the scale is then halved.
        """
        self.scaler.unscale_(optimizer)
        limit = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, limit)
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        self.scaler.step(optimizer)
        self.scaler.update()
        skipped = self.scaler.is_enabled() and self.scaler.get_scale() < scale
        optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "skipped": skipped, "loss_scale": scale}

    # ------------------------------------------------------------------ helpers
    def mean_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        return all_reduce_mean(values, self.dist, self.device)

    def check_replicas(self, model: nn.Module) -> None:
        """Raise if DDP replicas have drifted apart (compares float64 sums of every rank's parameters)."""
        if not self.dist.enabled:
            return
        with torch.no_grad():
            flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
            mine = torch.stack(
                [
                    flat.sum(),
                    flat.square().sum(),
                    (flat * torch.arange(flat.numel(), dtype=flat.dtype, device=flat.device)).sum(),
                ]
            )
        mine = mine.to(self.device)
        every = [torch.empty_like(mine) for _ in range(self.dist.world_size)]
        torch.distributed.all_gather(every, mine)
        if any(not torch.equal(every[0], other) for other in every[1:]):
            raise RuntimeError("DDP replicas hold different parameters; this is a bug, please report it")

    def to_device(self, batch: Any) -> Any:
        """Tensors of a (nested) batch dict moved to the device; other values unchanged."""
        if isinstance(batch, dict):
            return {k: self.to_device(v) for k, v in batch.items()}
        return batch.to(self.device, non_blocking=True) if torch.is_tensor(batch) else batch

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def split_batch(batch: dict, n: int) -> list[dict]:
    """A (nested) batch dict -> n micro-batches: tensors and lists split into n equal parts along dim 0; other
    values (a float "progress", None) shared by all. Each part is a view: nothing is copied."""
    if n == 1:
        return [batch]

    def part(v: Any, i: int, where: str) -> Any:
        if isinstance(v, dict):
            return {k: part(x, i, f"{where}.{k}") for k, x in v.items()}
        if torch.is_tensor(v) or isinstance(v, list):
            if len(v) % n:
                raise ValueError(
                    f"batch key {where!r}: {len(v)} items do not split into --engine.accumulate {n} equal "
                    "micro-batches; change --batch-size or --engine.accumulate"
                )
            m = len(v) // n
            return v[i * m : (i + 1) * m]
        return v

    return [{k: part(v, i, k) for k, v in batch.items()} for i in range(n)]
