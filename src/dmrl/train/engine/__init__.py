"""The training engine (issue 6): one place for devices, precision, loss scaling, clipping, accumulation,
data parallelism, activation checkpointing, compile and resumable training states.

Submodules: ``device`` (device / precision / seeds / RNG), ``distributed`` (torchrun process groups and the
sharded batch sampler), ``core`` (:class:`Engine`, :class:`EngineConfig`), ``state`` (training-state files).
"""

from dmrl.train.engine.core import Engine, EngineConfig, compile_submodules, set_grad_checkpointing
from dmrl.train.engine.device import (
    autocast,
    configure_cpu_threads,
    resolve_device,
    resolve_precision,
    seed_everything,
)
from dmrl.train.engine.distributed import DistInfo, GlobalBatchSampler, dist_info_from_env, shutdown_distributed
from dmrl.train.engine.state import TrainingState, load_latest_state, save_state, state_dirs

__all__ = [
    "DistInfo",
    "Engine",
    "EngineConfig",
    "GlobalBatchSampler",
    "TrainingState",
    "autocast",
    "compile_submodules",
    "configure_cpu_threads",
    "dist_info_from_env",
    "load_latest_state",
    "resolve_device",
    "resolve_precision",
    "save_state",
    "seed_everything",
    "set_grad_checkpointing",
    "shutdown_distributed",
    "state_dirs",
]
