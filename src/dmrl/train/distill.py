"""``dmrl distill --teacher CHECKPOINT``: a one- or two-step student of a diffusion policy, trained by the one
training loop (``--algo.type distill``, ``--policy.type student``) with the teacher's own observation settings.

With ``--dagger-rounds R`` the run has R + 1 rounds: round 0 distils on the store; after each round the student
acts in closed loop for ``--dagger-episodes`` episodes, the windows it planned from are added to the visited set,
and the next round continues from that student with the visited windows in every batch. Rounds 0 .. R-1 live in
``OUT-dagger/round{r}``, with the visited windows in ``OUT-dagger/visited.npz``; the last round is ``OUT``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from dmrl.algos.distill import DistillConfig
from dmrl.policies.student import StudentPolicyConfig
from dmrl.train.config import OfflineConfig, TrainConfig
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
    cache_images: bool = False
    """Decode the store's images once, into memory (as the multimodal preset trains its teacher)."""
    steps: int = 1000
    """Optimizer steps (of round 0 when --dagger-rounds)."""
    dagger_rounds: int = 0
    """DAgger rounds after the first distillation: roll the student out, add the windows it visited, distil again."""
    dagger_episodes: int = 100
    """Closed-loop episodes of the student per DAgger round (env seeds 300000 + round x episodes ..)."""
    dagger_steps: int = 500
    """Optimizer steps of each DAgger round."""
    visited_fraction: float = 0.5
    """Share of each batch drawn from the visited windows in DAgger rounds."""
    distance: str = "l2"
    """The loss: l2 (squared error to the teacher's chunk) or pseudo_huber (about its norm: the majority route where
    the student cannot tell two routes' noises apart)."""
    start_fraction: float = 0.5
    """Share of each batch trained from the start of the teacher's chain (1.0: a one-step student only where it
    samples; a two-step student needs < 1)."""
    batch_size: int = 256
    """Observations per step (each with --noise-samples fresh noises and the teacher's DDIM chain from each)."""
    noise_samples: int = 1
    """Noises per observation: batch_size x noise_samples chains per step, one encoding per observation."""
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
            source=OfflineConfig(cache_images=self.cache_images),
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
            algo=DistillConfig(
                lr=self.lr,
                teacher=self.teacher,
                train_encoder=self.train_encoder,
                visited_fraction=self.visited_fraction,
                start_fraction=self.start_fraction,
                noise_samples=self.noise_samples,
                distance=self.distance,
            ),
            engine=self.engine,
        )

    def __post_init__(self) -> None:
        if self.dagger_rounds < 0 or self.dagger_episodes < 1 or self.dagger_steps < 1:
            raise ValueError(
                f"--dagger-rounds / --dagger-episodes / --dagger-steps: got {self.dagger_rounds} / "
                f"{self.dagger_episodes} / {self.dagger_steps}; allowed >= 0 / >= 1 / >= 1"
            )


DAGGER_SEED = 300_000
"""First env seed of the students' closed-loop episodes: apart from evaluation (100000..) and selection (200000..)."""


def visited_windows(policy, env_id: str, env_kwargs: dict, seeds: list[int], n_envs: int) -> tuple[dict, Any]:
    """Roll ``policy`` out on ``seeds``; -> (the raw observation windows it planned from {key: (N, To, ...)},
    the episodes' EvalResult). One env steps in this process; more step in worker processes."""
    import numpy as np
    import torch

    from dmrl.train.evaluate import evaluate

    got: list[dict] = []

    def plan(obs):
        got.append({k: v.cpu().numpy() if torch.is_tensor(v) else np.asarray(v, dtype=str) for k, v in obs.items()})
        return policy.predict_chunk(obs)

    policy.set_planner(plan)
    try:
        result = evaluate(policy, env_id, seeds, env_kwargs, n_envs=n_envs, workers=n_envs > 1)
    finally:
        policy.set_planner(None)
    return {k: np.concatenate([g[k] for g in got]) for k in got[0]}, result


def run_dagger(cfg: DistillCommandConfig) -> dict:
    """Round 0 on the store, then ``dagger_rounds`` rounds on the store plus the student's visited windows; a round
    whose checkpoint exists is not run again (a crashed run goes on from its last finished round)."""
    import numpy as np

    from dmrl.algos.distill import load_windows, save_windows
    from dmrl.policies.checkpoint import load_policy
    from dmrl.train.run import train

    base = cfg.train_config()
    rounds = Path(f"{cfg.out}-dagger")
    if cfg.overwrite and rounds.exists():
        foreign = [p.name for p in rounds.iterdir() if not p.name.startswith(("round", "visited", "rollouts"))]
        if foreign:
            raise FileExistsError(f"--overwrite refuses to delete {rounds}: it holds {foreign[:3]}")
        shutil.rmtree(rounds)
    rounds.mkdir(parents=True, exist_ok=True)
    visited_path = rounds / "visited.npz"
    prev: Path | None = None
    summary: dict = {}
    for r in range(cfg.dagger_rounds + 1):
        last = r == cfg.dagger_rounds
        out = cfg.out if last else rounds / f"round{r}"
        algo = dataclasses.replace(base.algo, from_teacher=prev is None, visited=visited_path if r else None)
        if r:  # a trained student with a fresh optimizer: a short ramp, not BC's 200 steps (a whole short round)
            algo = dataclasses.replace(algo, warmup_steps=min(algo.warmup_steps, cfg.dagger_steps // 10))
        run = dataclasses.replace(
            base,
            out=out,
            init=prev,
            steps=cfg.steps if r == 0 else cfg.dagger_steps,
            eval_episodes=cfg.eval_episodes if last else 0,
            algo=algo,
            resume=cfg.resume and (out / "config.json").is_file(),  # --resume: the round that was running
        )
        if last or not (out / "checkpoint" / "config.json").is_file():
            summary = train(run)
        if last:
            break
        prev = out / "checkpoint"
        own = rounds / f"visited{r}.npz"
        if not own.exists():
            student, meta = load_policy(prev)
            first = DAGGER_SEED + r * cfg.dagger_episodes
            seeds = list(range(first, first + cfg.dagger_episodes))
            windows, evaluated = visited_windows(student, meta["env_id"], meta["env_kwargs"], seeds, cfg.eval_envs)
            result = evaluated.summary()
            save_windows(own, windows)
            n = len(next(iter(windows.values())))
            with (rounds / "rollouts.jsonl").open("a") as f:
                f.write(json.dumps({"round": r, "windows": n, **result}, default=str) + "\n")
        parts = [load_windows(rounds / f"visited{i}.npz") for i in range(r + 1)]
        save_windows(visited_path, {k: np.concatenate([w[k] for w in parts]) for k in parts[0]})
    return summary


def run_distill(cfg: DistillCommandConfig) -> None:
    from dmrl.train.run import train

    train_cfg = cfg.train_config()
    summary = run_dagger(cfg) if cfg.dagger_rounds else train(train_cfg)
    print(json.dumps(summary, indent=2, default=str))
    print(f"checkpoint: {train_cfg.out / 'checkpoint'}")
