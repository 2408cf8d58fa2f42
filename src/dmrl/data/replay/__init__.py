"""Replay ring (optionally in shared memory) with uniform or sum-tree prioritized sampling."""

from dmrl.data.replay.buffer import ReplayBuffer, ReplayConfig, ReplayHandle
from dmrl.data.replay.sumtree import SumTree

__all__ = ["ReplayBuffer", "ReplayConfig", "ReplayHandle", "SumTree"]
