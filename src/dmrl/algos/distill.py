"""Distillation of a diffusion policy into a one- or two-step student (:mod:`dmrl.policies.student`).

The student's loss reads the teacher's deterministic DDIM chain, so the algorithm is behaviour cloning's (AdamW,
warm-up + cosine, the exported EMA) around a student that starts as a copy of its teacher and has the teacher
attached. ``dmrl distill --teacher CHECKPOINT`` builds this run from the teacher's own settings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

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

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.teacher is None:
            raise ValueError("--algo.teacher: required (the diffusion checkpoint to distill, e.g. runs/bc/checkpoint)")
        if not (Path(self.teacher) / "config.json").is_file():
            raise FileNotFoundError(
                f"--algo.teacher {self.teacher}: not a policy checkpoint directory (a run's checkpoint/)"
            )


class Distill(BC):
    """BC's update on the student's distillation loss."""

    @classmethod
    def build(cls, policy: StudentPolicy, config: DistillConfig, engine: Stepper, total_steps: int) -> Distill:
        """Load the teacher, start the student from it, attach it, freeze the encoder unless asked."""
        assert config.teacher is not None  # checked by DistillConfig
        teacher, _ = load_policy(config.teacher)
        uncopied = policy.copy_teacher(teacher)
        if uncopied:
            log.info("distill: %d denoiser tensors start fresh (%s ...)", len(uncopied), ", ".join(uncopied[:3]))
        policy.attach_teacher(teacher)
        if not config.train_encoder:
            policy.encoder.requires_grad_(False)
        return cls(policy, config, engine, total_steps)
