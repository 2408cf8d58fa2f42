"""Distillation of a diffusion policy into a one- or two-step student (:mod:`dmrl.policies.student`).

The student's loss reads the teacher's deterministic DDIM chain, so the algorithm is behaviour cloning's (AdamW,
warm-up + cosine, the exported EMA) around a student that starts as a copy of its teacher and has the teacher
attached. ``dmrl distill --teacher CHECKPOINT`` builds this run from the teacher's own settings.

DAgger (Ross et al. 2011) for a student: the store holds the expert's states only, but a student drifts to states
the expert never visited. ``visited`` names observation windows the student planned from in closed loop (an
``.npz`` of raw windows {key: (N, To, ...)}, written by ``dmrl distill --dagger-rounds``); a fraction of every batch
is drawn from them, and the loss labels them as it labels the store's: the teacher's DDIM chain from the same noise
at that window.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from dmrl.algos.bc import BC, BCConfig
from dmrl.algos.common import Stepper
from dmrl.policies.checkpoint import load_policy
from dmrl.policies.student import StudentPolicy

log = logging.getLogger(__name__)


@dataclass
class DistillConfig(BCConfig):
    """Distillation: the teacher checkpoint, whether the student's copy of its encoder trains, and BC's optimizer,
    schedule and EMA."""

    teacher: Path | None = None
    """The diffusion policy checkpoint to distill (a run's checkpoint/); required."""
    train_encoder: bool = False
    """Fine-tune the student's copy of the teacher's observation encoder (default: frozen, as the teacher's)."""
    from_teacher: bool = True
    """Start the student from the teacher's weights (False: keep the weights of --init, a previous DAgger round)."""
    visited: Path | None = None
    """Observation windows the student visited in closed loop (.npz of raw {key: (N, To, ...)}), labelled by the
    teacher and mixed into every batch (DAgger); None: the store's windows only."""
    visited_fraction: float = 0.5
    """Share of each batch drawn from ``visited`` (when given)."""
    distance: str = "l2"
    """l2: the squared error to the teacher's chunk; pseudo_huber: sqrt(err + c²) - c, about the error's norm (Song &
    Dhariwal 2023's consistency loss): where the student cannot tell noises of two routes apart, l2's optimum is the
    routes' mean, pseudo_huber's their geometric median (the majority route)."""
    start_fraction: float = 0.5
    """Share of each batch trained from the start of the teacher's chain (k = 0, where a one-step student samples);
    the rest from a point drawn uniformly on it. 1.0: a one-step student trained only where it samples (as OneDP's
    one-step generator); a two-step student needs < 1 (its second call starts mid-chain)."""
    noise_samples: int = 1
    """Noises (teacher chains) per observation in a batch: R chains share one encoding, so a batch of B / R
    observations labels as many chains as B would, at a fraction of a multimodal encoder's cost."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.visited_fraction <= 1.0:
            raise ValueError(f"--algo.visited-fraction: got {self.visited_fraction}; allowed (0, 1]")
        if self.distance not in ("l2", "pseudo_huber"):
            raise ValueError(f"--algo.distance: got {self.distance!r}; allowed l2, pseudo_huber")
        if not 0.0 <= self.start_fraction <= 1.0:
            raise ValueError(f"--algo.start-fraction: got {self.start_fraction}; allowed [0, 1]")
        if not isinstance(self.noise_samples, int) or self.noise_samples < 1:
            raise ValueError(f"--algo.noise-samples: got {self.noise_samples!r}; allowed an integer >= 1")
        if self.visited is not None and not Path(self.visited).is_file():
            raise FileNotFoundError(f"--algo.visited {self.visited}: no such file (an .npz of observation windows)")
        # teacher None is checked when the algorithm is built: --resume reads a saved run against this config's
        # defaults (DistillConfig() must construct), and build comes before anything is written.
        if self.teacher is not None and not (Path(self.teacher) / "config.json").is_file():
            raise FileNotFoundError(
                f"--algo.teacher {self.teacher}: not a policy checkpoint directory (a run's checkpoint/)"
            )


def load_windows(path: Path) -> dict[str, np.ndarray]:
    """Observation windows saved by :func:`save_windows`: {key: (N, To, ...)} (strings as a str array)."""
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def save_windows(path: Path, windows: dict[str, np.ndarray]) -> None:
    """Write {key: (N, To, ...)} atomically (a crash leaves the previous file)."""
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **windows)
    tmp.replace(path)


def mix_windows(
    batch: dict, windows: dict[str, np.ndarray], fraction: float, gen: torch.Generator, keys: Sequence[str] = ()
) -> dict:
    """``batch`` with the observations of its first round(fraction * B) items replaced by windows drawn uniformly
    (with replacement) from ``windows``; the other keys (actions, masks) are untouched, as the loss reads only
    their shapes. ``keys``: the observations to replace (default: all of the batch's); the others stay as they
    are (a frozen encoder's student does not read its auxiliary head's state labels)."""
    obs = batch["obs"]
    b = int(batch["action"].shape[0])
    n = min(b, max(1, round(fraction * b)))
    size = len(next(iter(windows.values())))
    idx = torch.randint(0, size, (n,), generator=gen).numpy()
    mixed: dict = {}
    for key, value in obs.items():
        if keys and key not in keys:
            mixed[key] = value
            continue
        if key not in windows:
            raise ValueError(f"distill: the visited windows have no {key!r} (they have {sorted(windows)})")
        drawn = windows[key][idx]
        if isinstance(value, list):  # instructions
            mixed[key] = [str(x) for x in drawn] + list(value[n:])
        else:
            mixed[key] = torch.cat([torch.as_tensor(drawn).to(value.device, value.dtype), value[n:]])
    return {**batch, "obs": mixed}


class Distill(BC):
    """BC's update on the student's distillation loss (with DAgger's visited windows mixed in when given)."""

    def __init__(self, policy: StudentPolicy, config: DistillConfig, engine: Stepper, total_steps: int):
        super().__init__(policy, config, engine, total_steps)
        self.visited = load_windows(config.visited) if config.visited is not None else None
        self._gen = torch.Generator().manual_seed(0)

    def update(self, batch: dict) -> dict[str, Tensor | float]:
        if self.visited is not None:
            keys = self.actor.chunk.obs_keys
            batch = mix_windows(batch, self.visited, self.config.visited_fraction, self._gen, keys)
        return super().update(batch)

    @classmethod
    def build(cls, policy: StudentPolicy, config: DistillConfig, engine: Stepper, total_steps: int) -> Distill:
        """Load the teacher, start the student from it (unless ``from_teacher`` is off), attach it, freeze the
        encoder unless asked."""
        if config.teacher is None:
            raise ValueError("--algo.teacher: required (the diffusion checkpoint to distill, e.g. runs/bc/checkpoint)")
        if config.visited is not None and policy.chunk.aux_state and config.train_encoder:
            raise ValueError(
                "--algo.visited: a student training its encoder with aux_state cannot mix in visited windows (they "
                "carry no aux targets); keep the encoder frozen (no --algo.train-encoder)"
            )
        if policy.config.steps > 1 and config.start_fraction == 1.0:
            raise ValueError(
                f"--algo.start-fraction 1.0: a {policy.config.steps}-step student samples mid-chain too; use < 1"
            )
        policy.start_fraction, policy.distance = config.start_fraction, config.distance
        policy.noise_samples = config.noise_samples
        teacher, _ = load_policy(config.teacher)
        if config.from_teacher:
            uncopied = policy.copy_teacher(teacher)
            if uncopied:
                log.info("distill: %d denoiser tensors start fresh (%s ...)", len(uncopied), ", ".join(uncopied[:3]))
        policy.attach_teacher(teacher)
        if not config.train_encoder:
            policy.freeze_encoder()
        return cls(policy, config, engine, total_steps)
