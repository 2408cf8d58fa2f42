"""What every actor-critic algorithm shares with the trainer: the engine it steps through and micro-batching.

An algorithm is an ``nn.Module`` holding its actor, critic and target networks (so ``engine.prepare(algo)`` moves
them all and its state_dict is the whole resumable state), its optimizers, and one readable ``update``:

    algo = DiffusionQL(actor, critic, config, engine)     # or TD3BC; actor and critic built on engine.device
    engine.prepare(algo)                                  # grad checkpointing; clipping covers the trainable params
    logs = algo.update(micro_batches)                     # critic step, actor step, targets; dict of floats
    save_policy(dir, algo.policy)                         # the exported actor alone

The engine's clipping covers every trainable weight of the algorithm; each phase leaves gradients only on its own
network (the other has none: zeroed by its optimizer's step, or frozen while the actor reads the critic), so one
engine serves both optimizers without knowing about them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor


class Stepper(Protocol):
    """What an algorithm needs of the training engine (dmrl.train.engine.Engine has exactly this)."""

    def forward_backward(self, module: Any, batch: dict, last: bool = True) -> dict[str, Tensor]: ...

    def step(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]: ...


def as_micro_batches(batch: dict | list[dict]) -> list[dict]:
    """``update`` takes one batch or the engine.cfg.accumulate micro-batches of one step: always a list."""
    return batch if isinstance(batch, list) else [batch]


def backward_micro(engine: Stepper, loss_fn: Callable[[dict], dict[str, Tensor]], micro: list[dict]) -> dict:
    """Backward ``loss_fn`` (batch -> {"loss": scalar, ...}) over one step's micro-batches; their mean logs.

    Scalar outputs are averaged over the micro-batches into floats; per-item outputs (e.g. "td_error" (b,)) are
    concatenated in batch order into one numpy array (B,), so the trainer can match them to the sampled slots.
    The engine divides each loss by engine.cfg.accumulate, so ``micro`` must hold that many batches.
    """
    logs: dict[str, Any] = {}
    per_item: dict[str, list[np.ndarray]] = {}
    for k, mb in enumerate(micro):
        out = engine.forward_backward(loss_fn, mb, last=k == len(micro) - 1)
        for name, v in out.items():
            if v.ndim == 0:
                logs[name] = logs.get(name, 0.0) + float(v.detach()) / len(micro)
            else:
                per_item.setdefault(name, []).append(v.detach().float().cpu().numpy())
    return logs | {name: np.concatenate(parts) for name, parts in per_item.items()}
