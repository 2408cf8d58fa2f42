"""Typed experiment configuration: dataclasses, YAML presets and strict dict conversion (no eval, no _target_)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from dmrl.algos import ALGOS, CriticConfig, DiffusionQLConfig, TD3BCConfig
from dmrl.config_utils import from_dict, load_yaml, merge, to_dict  # noqa: F401  (re-exported for importers)
from dmrl.data.replay import ReplayConfig
from dmrl.policies import POLICIES, ChunkConfig
from dmrl.policies.diffusion import DiffusionPolicyConfig
from dmrl.policies.gaussian import GaussianPolicyConfig
from dmrl.policies.vae import VAEPolicyConfig
from dmrl.train.engine.core import EngineConfig

# --------------------------------------------------------------------------------------------------------------
# Experiment configs (composed of the component dataclasses; every field documented, checked in __post_init__)
# --------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to 0 (clipping is the engine's: ``engine.grad_clip``)."""

    lr: float = 1e-3
    weight_decay: float = 1e-6
    warmup_steps: int = 200

    def __post_init__(self) -> None:
        if not (self.lr > 0 and self.weight_decay >= 0 and self.warmup_steps >= 0):
            raise ValueError(f"optim: need lr > 0, weight_decay >= 0, warmup_steps >= 0; got {self}")


BC_DATA = ("replay", "successes")


@dataclasses.dataclass
class OnlineConfig:
    """``dmrl train --online``: collector processes, replay, publishing and evaluation of online actor-critic."""

    n_collectors: int = 2
    """Collector processes, each stepping envs_per_collector envs with the newest published actor."""
    envs_per_collector: int = 1
    """Envs per collector, stepped one after another (chunk by chunk)."""
    publish_every: int = 10
    """Updates between publishing the actor's weights to the collectors."""
    learning_starts: int = 1000
    """Chunk transitions in the replay buffer before the first update."""
    env_steps: int = 0
    """Stop after this many env steps collected in total (0: no limit; --steps bounds the updates)."""
    eval_every: int = 0
    """Updates between evaluations of a frozen actor snapshot in the evaluator process (0: none)."""
    eval_episodes: int = 4
    """Episodes per evaluation, seeds eval_seed, eval_seed + 1, ..."""
    exploration_noise: float = 0.1
    """Std of Gaussian noise added to the collectors' actions (env units, then clipped to [-1, 1])."""
    max_episode_steps: int = 0
    """Env steps per episode in collectors and evaluator (0: the env's default)."""
    prefill_from_dataset: bool = False
    """Copy every chunk transition of --dataset into the replay before collecting: the demonstrations stay in the
    off-policy data (and in the actor's BC term) while online episodes arrive, as in RLPD / Diffusion-QL
    fine-tuning. They count toward learning_starts; the ring overwrites them only after capacity new items."""
    bc_data: str = "replay"
    """What the diffusion-ql actor's BC term imitates. replay: the sampled replay batch, as in Diffusion-QL.
    successes: a second, uniformly sampled batch of successful episodes only: the dataset's (with
    prefill_from_dataset) and every online episode that succeeded (self-imitation, Oh et al. 2018), so the actor
    never clones its own failures; until the first success the actor follows the Q term alone."""
    replay: ReplayConfig = dataclasses.field(default_factory=lambda: ReplayConfig(capacity=100_000))

    def __post_init__(self) -> None:
        if self.bc_data not in BC_DATA:
            raise ValueError(f"online_rl.bc_data: got {self.bc_data!r}; allowed: {', '.join(BC_DATA)}")
        if self.n_collectors < 1 or self.envs_per_collector < 1 or self.publish_every < 1:
            raise ValueError(
                f"online: need n_collectors, envs_per_collector, publish_every >= 1; got {self.n_collectors}, "
                f"{self.envs_per_collector}, {self.publish_every}"
            )
        if self.learning_starts < 1 or self.env_steps < 0 or self.eval_every < 0 or self.eval_episodes < 1:
            raise ValueError(
                f"online: need learning_starts >= 1, env_steps >= 0, eval_every >= 0, eval_episodes >= 1; got "
                f"{self.learning_starts}, {self.env_steps}, {self.eval_every}, {self.eval_episodes}"
            )
        if self.exploration_noise < 0 or self.max_episode_steps < 0:
            raise ValueError(
                f"online: need exploration_noise >= 0 and max_episode_steps >= 0; got {self.exploration_noise}, "
                f"{self.max_episode_steps}"
            )


@dataclasses.dataclass
class TrainConfig:
    """``dmrl train``: behaviour cloning (or offline RL, --algo) of a chunk policy from an episode store."""

    dataset: Path = Path("data/grasp_expert.zarr")
    """Episode store written by ``dmrl collect`` (offline RL also reads its rewards and terminations)."""
    out: Path = Path("runs/bc")
    """Run directory: config.json, metrics.jsonl, tb/ (TensorBoard), checkpoint/ (EMA policy)."""
    policy: str = "diffusion"
    """Policy to train: diffusion, gaussian or vae."""
    algo: str = "bc"
    """bc (behaviour cloning), diffusion-ql (with --policy diffusion) or td3-bc (with --policy gaussian)."""
    init: Path | None = None
    """diffusion-ql / td3-bc: start the actor from this policy checkpoint (e.g. a BC run's checkpoint/); its
    chunk and policy settings must equal this run's."""
    chunk: ChunkConfig = dataclasses.field(default_factory=ChunkConfig)
    diffusion: DiffusionPolicyConfig = dataclasses.field(default_factory=DiffusionPolicyConfig)
    gaussian: GaussianPolicyConfig = dataclasses.field(default_factory=GaussianPolicyConfig)
    vae: VAEPolicyConfig = dataclasses.field(default_factory=VAEPolicyConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """Optimizer of --algo bc (diffusion-ql and td3-bc have their own learning rates)."""
    critic: CriticConfig = dataclasses.field(default_factory=CriticConfig)
    """Chunk critic of diffusion-ql and td3-bc: ensemble, width, discount, target rate."""
    diffusion_ql: DiffusionQLConfig = dataclasses.field(default_factory=DiffusionQLConfig)
    td3_bc: TD3BCConfig = dataclasses.field(default_factory=TD3BCConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    """Device, precision, clipping, accumulation, data parallelism, checkpointing, compile, state saving."""
    steps: int = 5000
    """Optimizer steps."""
    batch_size: int = 256
    """Samples per optimizer step, in total over accumulated micro-batches and torchrun ranks."""
    ema_decay: float = 0.995
    """EMA of the weights used for evaluation and saved as the policy (bc: warmed up as min(decay, (1+k)/(10+k));
    diffusion-ql: its EMA actor, a plain Polyak average at rate 1 - decay)."""
    val_fraction: float = 0.05
    """Fraction of episodes held out for the validation loss."""
    val_every: int = 1000
    seed: int = 0
    num_workers: int = 0
    """DataLoader worker processes."""
    cache_images: bool = False
    """Read the store's rgb/depth arrays into memory once (rgb H*W*3 bytes, depth H*W*4 per camera and step) instead
    of decompressing zarr chunks for every sample: at 64 px on 2 CPU cores that was ~40% of a multimodal step."""
    eval_episodes: int = 0
    """Closed-loop evaluation episodes after training (0: none); seeds eval_seed, eval_seed + 1, ..."""
    eval_seed: int = 100_000
    """First evaluation seed (far from the dataset's collection seeds)."""
    eval_envs: int = 8
    curve_every: int = 0
    """Optimizer steps between learning-curve points during offline training (0: none). A point runs a copy of the
    evaluation policy for curve_episodes episodes on seeds eval_seed, eval_seed + 1, ... and logs curve_success,
    curve_ci_low, curve_ci_high, curve_collision to metrics.jsonl; training's random streams are left untouched."""
    curve_episodes: int = 20
    """Episodes per learning-curve point (--curve-every)."""
    overwrite: bool = False
    """Replace an existing run directory."""
    resume: bool = False
    """Continue the run in --out from its newest training state (out/state/); the config must match."""
    online: bool = False
    """Train --algo diffusion-ql / td3-bc online: collectors fill a replay buffer (settings in online_rl); --steps
    counts updates, --dataset gives the normaliser statistics and shapes."""
    online_rl: OnlineConfig = dataclasses.field(default_factory=OnlineConfig)

    def __post_init__(self) -> None:
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite exclude each other: resume keeps the run, overwrite deletes it")
        if self.policy not in POLICIES:
            raise ValueError(f"--policy: got {self.policy!r}; allowed: {', '.join(POLICIES)}")
        if self.algo != "bc" and self.algo not in ALGOS:
            raise ValueError(f"--algo: got {self.algo!r}; allowed: bc, {', '.join(ALGOS)}")
        if self.algo != "bc" and self.policy != ALGOS[self.algo][2]:
            raise ValueError(
                f"--algo {self.algo} trains a {ALGOS[self.algo][2]} actor; got --policy {self.policy} "
                f"(pass --policy {ALGOS[self.algo][2]})"
            )
        if self.algo != "bc" and self.chunk.aux_state:
            raise ValueError(f"--chunk.aux-state: an auxiliary state loss is for --algo bc (got --algo {self.algo})")
        if self.algo != "bc" and self.chunk.pad_after is not None:
            raise ValueError(
                f"--chunk.pad-after: for --algo bc; offline RL's chunk transitions keep Ta - 1 (got --algo {self.algo})"
            )
        if self.init is not None and self.algo == "bc":
            raise ValueError(
                "--init starts an offline-RL actor from a checkpoint: use it with --algo diffusion-ql or td3-bc"
            )
        if self.online and self.algo == "bc":
            raise ValueError("--online trains an actor-critic: pass --algo diffusion-ql or td3-bc")
        if self.online_rl.bc_data != "replay" and self.algo != "diffusion-ql":
            raise ValueError(
                f"--online-rl.bc-data {self.online_rl.bc_data} is a diffusion-ql option; got --algo {self.algo}"
            )
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"--steps and --batch-size must be >= 1, got {self.steps} and {self.batch_size}")
        if self.curve_every < 0 or self.curve_episodes < 1:
            raise ValueError(
                f"need --curve-every >= 0 and --curve-episodes >= 1, got {self.curve_every} and {self.curve_episodes}"
            )
        if self.curve_every and self.online:
            raise ValueError("--curve-every is for offline training; online runs use --online-rl.eval-every")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"--ema-decay: got {self.ema_decay}; allowed [0, 1)")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"--val-fraction: got {self.val_fraction}; allowed [0, 1)")

    @property
    def policy_config(self) -> Any:
        return getattr(self, self.policy)
