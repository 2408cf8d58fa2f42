"""Replay ring (optionally in shared memory) with uniform or sum-tree prioritized sampling."""

from dmrl.data.replay.buffer import ReplayBuffer
from dmrl.data.replay.config import ReplayConfig, ReplayHandle
from dmrl.data.replay.lock import ProcessLock
from dmrl.data.replay.sumtree import SumTree

__all__ = ["ProcessLock", "ReplayBuffer", "ReplayConfig", "ReplayHandle", "SumTree"]
