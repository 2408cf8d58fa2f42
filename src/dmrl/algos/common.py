"""What every algorithm shares with the trainer: the engine it steps through.

An algorithm is an ``nn.Module`` holding the networks it trains and their targets (so its state_dict is the whole
resumable state), its optimizers, and one readable ``update``:

    algo = DiffusionQL(actor, critic, config, engine)     # or BC, TD3BC; networks built on engine.device
    logs = algo.update(batch)                             # one optimizer step (critic, actor, targets)
    save_policy(dir, algo.policy)                         # the exported policy alone

Its constructor calls ``engine.prepare`` on what it trains. The engine splits each batch into its accumulate
micro-batches and clips every trainable weight; each phase of an actor-critic update leaves gradients only on its
own network (the other has none: zeroed by its optimizer's step, or frozen while the actor reads the critic), so one
engine serves both optimizers without knowing about them.

The trainer (dmrl.train.run) reads: ``update(batch) -> logs`` (floats or 0-d tensors; "td_error" (B,) numpy for
PER), ``policy`` (exported), ``evaluation_policy()``, ``actor`` (the network whose replicas DDP keeps equal),
``optimizers`` / ``schedulers`` (name -> object, saved in the training state), the counter ``n_updates``, and
the class attribute ``batches``: "windows" (dmrl.data.SequenceDataset items: obs, action, action_mask; behaviour
cloning) or "transitions" (dmrl.data.ChunkTransitionDataset items, which add next_obs, reward, done, valid,
next_valid; offline and online RL). Online batches may carry two nested batches of the same layout: "actor", a
uniform draw for the actor's loss when the critic's batch is prioritized, and "bc", successful episodes for a
self-imitating BC term (None until there is one).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor


class Stepper(Protocol):
    """What an algorithm needs of the training engine (dmrl.train.engine.Engine has exactly this)."""

    device: torch.device

    def prepare(self, model: Any) -> Any: ...

    def backward(self, loss_fn: Any, batch: dict) -> dict[str, Tensor]: ...

    def step(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]: ...
