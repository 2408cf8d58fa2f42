"""Behaviour cloning: the policy's own imitation loss (denoising, likelihood or ELBO), AdamW with linear warm-up
then cosine decay, and an exponential moving average of the weights that is evaluated and exported.

The EMA is the diffusion-policy recipe (Chi et al. 2023; Ho et al. 2020): sampling from averaged weights gives
smoother, more reliable chunks than the last iterate. Its decay is warmed up so early averages do not cling to the
random initialisation.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dmrl.algos.common import Stepper
from dmrl.policies.base import ChunkPolicy


@dataclass
class BCConfig:
    """Behaviour cloning: optimizer, learning-rate schedule and the EMA of the weights that is exported."""

    lr: float = 1e-3
    """AdamW peak learning rate."""
    weight_decay: float = 1e-6
    """AdamW weight decay."""
    warmup_steps: int = 200
    """Warm-up steps, then cosine decay."""
    ema_decay: float = 0.995
    """EMA decay (exported weights)."""

    def __post_init__(self) -> None:
        if not (self.lr > 0 and self.weight_decay >= 0 and self.warmup_steps >= 0):
            raise ValueError(
                f"bc: need lr > 0, weight_decay >= 0, warmup_steps >= 0; got {self.lr}, {self.weight_decay}, "
                f"{self.warmup_steps}"
            )
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"--algo.ema-decay: got {self.ema_decay}; allowed [0, 1)")


def warmup_cosine(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Learning-rate factor at step k: linear warm-up over warmup_steps, then cosine decay to 0 at total_steps."""
    warm = max(1, warmup_steps)

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, total_steps - warm)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


@torch.no_grad()
def ema_update(average: nn.Module, model: nn.Module, decay: float) -> None:
    """average <- decay * average + (1 - decay) * model for trainable weights; buffers copied."""
    # Frozen weights (a frozen MiniLM or ViT backbone: millions of them) never move, so they are not averaged.
    pairs = [(e, p) for e, p in zip(average.parameters(), model.parameters(), strict=True) if p.requires_grad]
    torch._foreach_lerp_([e for e, _ in pairs], [p.detach() for _, p in pairs], 1.0 - decay)
    for b_avg, b in zip(average.buffers(), model.buffers(), strict=True):
        b_avg.copy_(b)


class BC(nn.Module):
    """The trained policy, its EMA (what is evaluated and exported), AdamW and its schedule.

    Batches: dmrl.data.SequenceDataset items with B in front (obs {key: (B, To, ...)} raw, action (B, Tp, Da) raw,
    action_mask (B, Tp)) plus "progress" in [0, 1] (the hybrid loss weights follow it). Construct with the policy
    built on the CPU; the engine moves it, wraps it for data parallelism and splits each batch into micro-batches.
    """

    batches = "windows"  # dmrl.data.SequenceDataset items (see dmrl.algos.common)

    def __init__(self, policy: ChunkPolicy, config: BCConfig, engine: Stepper, total_steps: int):
        super().__init__()
        self.config, self.total_steps = config, total_steps
        self.engine = engine
        # Copied before compile / DDP wrap: a plain module that is only ever evaluated and saved.
        self.actor_ema = copy.deepcopy(policy).eval().requires_grad_(False)
        self.actor = policy
        object.__setattr__(self, "model", engine.prepare(policy.train()))  # DDP-wrapped under torchrun
        self.actor_ema.to(engine.device)
        self.opt = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, warmup_cosine(config.warmup_steps, total_steps))
        self.n_updates = 0

    @classmethod
    def build(cls, policy: ChunkPolicy, config: BCConfig, engine: Stepper, total_steps: int) -> BC:
        """The algorithm for a freshly built policy (on the CPU; moved to the engine's device here)."""
        return cls(policy, config, engine, total_steps)

    @property
    def policy(self) -> ChunkPolicy:
        """The exported policy: the EMA weights."""
        return self.actor_ema

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"policy": self.opt}

    @property
    def schedulers(self) -> dict[str, Any]:
        return {"policy": self.sched}

    def update(self, batch: dict) -> dict[str, Tensor | float]:
        """One optimizer step on the policy's loss; returns its losses (tensors), lr, grad_norm, loss_scale."""
        losses = self.engine.backward(self.model, batch)
        stats = self.engine.step(self.opt)
        self.sched.step()
        self.n_updates += 1
        ema_update(self.actor_ema, self.actor, min(self.config.ema_decay, (1 + self.n_updates) / (10 + self.n_updates)))
        return {
            "lr": self.sched.get_last_lr()[0],
            **losses,
            "grad_norm": stats["grad_norm"],
            "loss_scale": stats["loss_scale"],
        }

    def evaluation_policy(self) -> ChunkPolicy:
        return self.actor_ema
