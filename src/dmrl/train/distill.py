"""``dmrl distill --teacher CHECKPOINT``: a one- or two-step student of a diffusion policy, trained by the one
training loop (``--algo.type distill``, ``--policy.type student``) with the teacher's own observation settings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from dmrl.algos.distill import DistillConfig
from dmrl.policies.student import StudentPolicyConfig
from dmrl.train.config import TrainConfig
from dmrl.train.engine.core import EngineConfig


@dataclasses.dataclass
class DistillCommandConfig:
    """``dmrl distill``: train a student that maps noise to the teacher's chunk in one (or two) network calls."""

    teacher: Path
    """The diffusion policy checkpoint to distill (a run's checkpoint/)."""
    out: Path = Path("runs/student")
    """Run directory: metrics, state/, checkpoint/ (the student)."""
    dataset: Path | None = None
    """Episode store whose observations condition the distillation (default: the teacher's training store)."""
    student_steps: int = 1
    """Network calls per chunk: 1 or 2."""
    hidden_dim: int | None = None
    """The student MLP denoiser's width (default: the teacher's, starting from its weights)."""
    n_blocks: int | None = None
    """The student MLP denoiser's blocks (default: the teacher's)."""
    train_encoder: bool = False
    """Fine-tune the student's copy of the teacher's encoder (default: frozen)."""
    steps: int = 1000
    """Optimizer steps."""
    batch_size: int = 256
    """Observations per step (each with a fresh noise and the teacher's DDIM chain from it)."""
    lr: float = 3e-4
    """AdamW peak learning rate."""
    seed: int = 0
    """RNG seed."""
    eval_episodes: int = 0
    """Evaluation episodes after training (the teacher's env, seeds from --eval-seed)."""
    eval_seed: int = 100_000
    """First evaluation seed."""
    eval_envs: int = 2
    """Evaluation envs (worker processes)."""
    overwrite: bool = False
    """Replace an existing run."""
    resume: bool = False
    """Continue the run in --out."""
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    """Device, precision, gradient handling and training states."""

    def train_config(self) -> TrainConfig:
        """The ``dmrl train`` config of this distillation, the chunk and grid read off the teacher's checkpoint."""
        from dmrl.config_utils import from_dict
        from dmrl.policies import ChunkConfig, DiffusionPolicyConfig

        config_json = Path(self.teacher) / "config.json"
        if not config_json.is_file():
            raise FileNotFoundError(
                f"--teacher {self.teacher}: not a policy checkpoint directory (a run's checkpoint/)"
            )
        from dmrl.policies.checkpoint import upgrade_config

        saved = upgrade_config(json.loads(config_json.read_text()), str(config_json))
        if saved.get("policy") != "diffusion":
            raise ValueError(f"--teacher {self.teacher}: a {saved.get('policy')} policy; distill a diffusion policy")
        teacher = from_dict(DiffusionPolicyConfig, saved["config"], "config")
        dataset = self.dataset or saved.get("meta", {}).get("dataset")
        if dataset is None:
            raise ValueError(f"--teacher {self.teacher}: its meta names no dataset; pass --dataset STORE")
        kwargs: dict[str, Any] = dict(teacher.denoiser_kwargs)
        if self.hidden_dim is not None or self.n_blocks is not None:
            if teacher.denoiser != "mlp":
                raise ValueError(f"--hidden-dim / --n-blocks size an mlp student; the teacher's is {teacher.denoiser}")
            kwargs |= {k: v for k, v in (("hidden_dim", self.hidden_dim), ("n_blocks", self.n_blocks)) if v is not None}
        student = StudentPolicyConfig(
            steps=self.student_steps,
            denoiser=teacher.denoiser,
            denoiser_kwargs=kwargs,
            schedule=teacher.schedule,
            num_train_steps=teacher.num_train_steps,
            teacher_steps=teacher.num_inference_steps,
            timestep_spacing=teacher.timestep_spacing,
        )
        return TrainConfig(
            dataset=Path(dataset),
            out=self.out,
            steps=self.steps,
            batch_size=self.batch_size,
            seed=self.seed,
            eval_episodes=self.eval_episodes,
            eval_seed=self.eval_seed,
            eval_envs=self.eval_envs,
            overwrite=self.overwrite,
            resume=self.resume,
            chunk=from_dict(ChunkConfig, saved["chunk"], "chunk"),
            policy=student,
            algo=DistillConfig(lr=self.lr, teacher=self.teacher, train_encoder=self.train_encoder),
            engine=self.engine,
        )


def run_distill(cfg: DistillCommandConfig) -> None:
    from dmrl.train.run import train

    train_cfg = cfg.train_config()
    summary = train(train_cfg)
    print(json.dumps(summary, indent=2, default=str))
    print(f"checkpoint: {train_cfg.out / 'checkpoint'}")
