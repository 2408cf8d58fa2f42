"""Data parallelism under torchrun: process-group set-up from the environment and a sharded batch sampler.

``torchrun --nproc-per-node N -m dmrl train ...`` starts N processes and sets RANK, WORLD_SIZE and
LOCAL_RANK (plus MASTER_ADDR/PORT or a rendezvous endpoint); a plain ``dmrl train`` has none and runs alone.
The backend follows the device: gloo on CPU, NCCL on CUDA, HCCL on Ascend NPU.

Batches are global: ``--batch-size`` is the number of samples per optimizer step summed over ranks and
accumulated micro-batches, so a config means the same training whatever the number of devices. Every rank
draws the same permutation from (seed, epoch), takes its contiguous slice of each global batch and cuts it into
``accumulate`` micro-batches. N ranks therefore see exactly the samples one process would at the same global
batch, and the position in the data is a pure function of the step, which is what makes resume exact.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dmrl.train.engine.device import DDP_BACKENDS


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job: rank among world_size, and local_rank on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the only one that logs and writes checkpoints."""
        return self.rank == 0


def dist_info_from_env() -> DistInfo:
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK; absent means a single process."""
    try:
        info = DistInfo(
            int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
        )
    except ValueError:
        raise ValueError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (launch with torchrun)") from None
    if not 0 <= info.rank < info.world_size:
        raise ValueError(f"RANK={info.rank} is outside 0..WORLD_SIZE-1={info.world_size - 1}")
    return info


def init_distributed(info: DistInfo, device: torch.device) -> None:
    """Join the process group (a no-op for one process or when already joined)."""
    if not info.enabled or dist.is_initialized():
        return
    kwargs: dict[str, Any] = {}
    if device.type != "cpu":
        kwargs["device_id"] = device  # lets NCCL/HCCL bind eagerly to this rank's device
    dist.init_process_group(DDP_BACKENDS[device.type], rank=info.rank, world_size=info.world_size, **kwargs)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_mean(values: dict[str, float], info: DistInfo, device: torch.device) -> dict[str, float]:
    """Mean of scalar metrics over ranks (for logs); identity for one process."""
    if not info.enabled or not values:
        return values
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(values, (t / info.world_size).tolist(), strict=True))


def gather_to_main(obj: Any, info: DistInfo) -> list[Any] | None:
    """Every rank's ``obj`` as a list on rank 0 (None elsewhere)."""
    if not info.enabled:
        return [obj]
    out: list[Any] | None = [None] * info.world_size if info.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def scatter_from_main(objs: list[Any] | None, info: DistInfo) -> Any:
    """Rank r receives ``objs[r]`` from rank 0."""
    if not info.enabled:
        return objs[0] if objs else None
    out: list[Any] = [None]
    dist.scatter_object_list(out, objs if info.is_main else None, src=0)
    return out[0]


class GlobalBatchSampler:
    """Endless index lists: this rank's share of each global batch, one list per step, from ``start_step`` on.

    n samples; global_batch = micro-batch size x accumulate x world_size. Epoch e is the permutation drawn
    from seed and e; the incomplete tail of each epoch is dropped (static batch shapes).
    """

    def __init__(
        self, n: int, global_batch: int, accumulate: int, info: DistInfo, seed: int, start_step: int = 0
    ) -> None:
        per_step = accumulate * info.world_size
        if global_batch % per_step:
            raise ValueError(
                f"--batch-size {global_batch} must be divisible by accumulate x ranks = {accumulate} x "
                f"{info.world_size}; change --batch-size or --engine.accumulate"
            )
        if global_batch > n:
            raise ValueError(f"--batch-size {global_batch} exceeds the {n} training windows; lower --batch-size")
        self.n, self.global_batch, self.accumulate, self.info = n, global_batch, accumulate, info
        self.micro = global_batch // per_step
        self.seed, self.start_step = seed, start_step
        self.steps_per_epoch = n // global_batch

    def __iter__(self) -> Iterator[list[int]]:
        step, epoch, perm = self.start_step, -1, torch.empty(0, dtype=torch.long)
        share = self.global_batch // self.info.world_size
        while True:
            e, b = divmod(step, self.steps_per_epoch)
            if e != epoch:
                epoch = e
                perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + e))
            # One list per step: the engine splits it into the accumulate micro-batches (Engine.backward).
            yield perm[b * self.global_batch + self.info.rank * share :][:share].tolist()
            step += 1
