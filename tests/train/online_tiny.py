"""Shared pieces of the online-training tests: a tiny Diffusion-QL config, a tiny expert store, and /proc helpers to
see which child processes a run leaves behind."""

from __future__ import annotations

import os
from pathlib import Path

from dmrl.cli import main

DIFFUSION = {
    "type": "diffusion",
    "num_train_steps": 20,
    "num_inference_steps": 3,
    "denoiser_kwargs": {"hidden_dim": 32},
}
ONLINE = {"type": "online", "learning_starts": 4, "max_episode_steps": 24, "publish_every": 2}
TINY = {
    "batch_size": 8,
    "chunk": {"horizon": 8, "n_action_steps": 4, "encoder": {"width": 32}},
    "policy": DIFFUSION,
    "algo": {"type": "diffusion-ql", "critic": {"hidden": 32, "depth": 2}},
    "source": ONLINE,
}


def collect_tiny(out: Path) -> Path:
    """Two expert episodes, state only (the normaliser statistics and shapes of an online run)."""
    assert main(["collect", "--out", str(out), "--episodes", "2", "--workers", "0", "--obs-modes", "state"]) == 0
    return out


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
