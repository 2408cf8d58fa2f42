"""``dmrl train``'s configuration: the run's own settings plus a policy, an algorithm and a data source, each chosen
by type (``--policy.type``, ``--algo.type``, ``--source.type``) so help and validation show only what applies."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from dmrl.algos import ALGOS
from dmrl.config_utils import choice, type_name
from dmrl.data.replay import ReplayConfig
from dmrl.policies import POLICIES, ChunkConfig
from dmrl.train.engine.core import EngineConfig


class _ConfigClasses(Mapping):
    """A live view name -> config class of a registry name -> (class, config class, ...): types registered later
    (register_policy, register_algo) are choices too."""

    def __init__(self, registry: dict[str, tuple]) -> None:
        self.registry = registry

    def __getitem__(self, name: str) -> type:
        return self.registry[name][1]

    def __iter__(self) -> Iterator[str]:
        return iter(self.registry)

    def __len__(self) -> int:
        return len(self.registry)


#: --policy.type name -> its config class; --algo.type likewise.
POLICY_TYPES: Mapping[str, type] = _ConfigClasses(POLICIES)
ALGO_TYPES: Mapping[str, type] = _ConfigClasses(ALGOS)
SELF_IMITATING = ("diffusion-ql", "qc", "idql", "fql")  # algorithms whose BC term reads batch["bc"] (bc_data successes)
BC_DATA = ("replay", "successes")
BACKENDS = ("process", "ray")  # --source.backend: where online collectors run


@dataclasses.dataclass
class OfflineConfig:
    """Train on the episode store's windows (behaviour cloning) or chunk transitions (offline RL)."""

    val_fraction: float = 0.05
    """Episodes held out for validation."""
    val_every: int = 1000
    """Steps between validation losses."""
    num_workers: int = 0
    """DataLoader worker processes."""
    cache_images: bool = False
    """Decode images once, into memory."""
    curve_every: int = 0
    """Steps between learning-curve points."""
    curve_episodes: int = 20
    """Episodes per learning-curve point."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"--source.val-fraction: got {self.val_fraction}; allowed [0, 1)")
        if self.val_every < 1 or self.num_workers < 0:
            raise ValueError(
                f"--source.val-every >= 1 and --source.num-workers >= 0 required; got {self.val_every}, "
                f"{self.num_workers}"
            )
        if self.curve_every < 0 or self.curve_episodes < 1:
            raise ValueError(
                f"need --source.curve-every >= 0 and --source.curve-episodes >= 1, got {self.curve_every} and "
                f"{self.curve_episodes}"
            )


@dataclasses.dataclass
class OnlineConfig:
    """Online actor-critic: collector processes fill a replay buffer with the newest actor's chunks (Ape-X);
    --steps counts updates and --dataset gives the normaliser statistics and shapes."""

    n_collectors: int = 2
    """Collector processes."""
    envs_per_collector: int = 1
    """Envs per collector, stepped one after another."""
    publish_every: int = 10
    """Updates between publishing the actor's weights."""
    learning_starts: int = 1000
    """Chunk transitions in replay before the first update."""
    env_steps: int = 0
    """Stop after this many env steps in total (0: no limit)."""
    env_steps_per_update: float = 0.0
    """Replay ratio once learning starts: collectors pause and the learner waits to keep env steps per update at
    this (0: both run free)."""
    eval_every: int = 0
    """Updates between snapshot evaluations (0: none)."""
    eval_episodes: int = 4
    """Episodes per evaluation, from --eval-seed."""
    exploration_noise: float = 0.1
    """Std of Gaussian noise on collectors' actions."""
    max_episode_steps: int = 0
    """Env steps per episode (0: the env's default)."""
    prefill_from_dataset: bool = False
    """Start the replay with --dataset's transitions (RLPD)."""
    offline_share: float = 0.0
    """Share of each batch drawn from --dataset's transitions, kept apart from the replay (RLPD: 0.5)."""
    bc_data: str = "replay"
    """BC term's data: replay or successes (self-imitation)."""
    replay: ReplayConfig = dataclasses.field(default_factory=lambda: ReplayConfig(capacity=100_000))
    backend: str = "process"
    """Where collectors and the evaluator run: process (children of the learner) or ray (Ray actors; docs/ray.md)."""
    ray_address: str = ""
    """Ray cluster to join (host:port of `ray start --head`, or auto); empty: a local one on this machine."""

    def offline_items(self, batch_size: int) -> int:
        """How many of a batch's ``batch_size`` items come from the dataset (offline_share of them, rounded)."""
        return int(round(batch_size * self.offline_share))

    def __post_init__(self) -> None:
        if self.bc_data not in BC_DATA:
            raise ValueError(f"--source.bc-data: got {self.bc_data!r}; allowed: {', '.join(BC_DATA)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"--source.backend: got {self.backend!r}; allowed: {', '.join(BACKENDS)}")
        if self.ray_address and self.backend != "ray":
            raise ValueError(f"--source.ray-address {self.ray_address} needs --source.backend ray")
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
        if not 0.0 <= self.offline_share < 1.0:
            raise ValueError(f"--source.offline-share: got {self.offline_share}; allowed [0, 1) (0.5: RLPD)")
        if self.offline_share > 0 and self.prefill_from_dataset:
            raise ValueError(
                "--source.offline-share keeps the dataset in its own ring: drop --source.prefill-from-dataset"
            )
        if self.env_steps_per_update < 0:
            raise ValueError(f"--source.env-steps-per-update: got {self.env_steps_per_update}; need >= 0 (0: free)")
        if self.env_steps_per_update and self.backend == "ray":
            raise ValueError("--source.env-steps-per-update needs --source.backend process (ray collectors are not "
                             "paced yet); drop one of them")  # fmt: skip
        if self.exploration_noise < 0 or self.max_episode_steps < 0:
            raise ValueError(
                f"online: need exploration_noise >= 0 and max_episode_steps >= 0; got {self.exploration_noise}, "
                f"{self.max_episode_steps}"
            )


@dataclasses.dataclass
class RolloutConfig:
    """On-policy rollouts (DPPO): every update is one fresh rollout of the current policy in --source.n-envs envs
    stepped in the learner's process; --steps counts updates (rollouts) and --dataset gives normaliser statistics
    and shapes."""

    n_envs: int = 16
    """Envs stepped in lockstep (one after another)."""
    decisions: int = 25
    """Decisions (chunks) per env in each rollout."""
    env_steps: int = 0
    """Stop after this many env steps in total (0: no limit)."""
    max_episode_steps: int = 0
    """Env steps per episode (0: the env's default)."""
    curve_every: int = 0
    """Updates between learning-curve points (0: none)."""
    curve_episodes: int = 20
    """Episodes per learning-curve point, from --eval-seed."""

    def __post_init__(self) -> None:
        if self.n_envs < 1 or self.decisions < 1 or self.curve_episodes < 1:
            raise ValueError(
                f"rollout: need --source.n-envs, --source.decisions, --source.curve-episodes >= 1; got {self.n_envs}, "
                f"{self.decisions}, {self.curve_episodes}"
            )
        if self.env_steps < 0 or self.max_episode_steps < 0 or self.curve_every < 0:
            raise ValueError(
                f"rollout: need --source.env-steps, --source.max-episode-steps, --source.curve-every >= 0; got "
                f"{self.env_steps}, {self.max_episode_steps}, {self.curve_every}"
            )


SOURCE_TYPES: dict[str, type] = {"offline": OfflineConfig, "online": OnlineConfig, "rollout": RolloutConfig}

P = TypeVar("P")
A = TypeVar("A")
S = TypeVar("S")
C = TypeVar("C", bound=ChunkConfig)


@dataclasses.dataclass
class TrainConfig(Generic[P, A, S, C]):
    """``dmrl train``: a chunk policy trained by an algorithm on an episode store (offline) or on collected
    experience (online, rollout). Choose with --policy.type {diffusion,gaussian,vae}, --algo.type
    {bc,diffusion-ql,td3-bc,qc,idql,fql,dsrl,dppo} and --source.type {offline,online,rollout}; this help lists the
    chosen types' flags."""

    dataset: Path = Path("data/grasp_expert.zarr")
    """Episode store from dmrl collect."""
    out: Path = Path("runs/bc")
    """Run directory: metrics, tb/, state/, checkpoint/."""
    steps: int = 5000
    """Optimizer steps (online: updates)."""
    batch_size: int = 256
    """Samples per step over all ranks (not dppo: see --algo.minibatch)."""
    seed: int = 0
    """RNG seed (init, data order, noise)."""
    init: Path | None = None
    """Policy checkpoint to start from."""
    eval_episodes: int = 0
    """Evaluation episodes after training."""
    eval_seed: int = 100_000
    """First evaluation seed."""
    eval_envs: int = 8
    """Evaluation envs (worker processes)."""
    overwrite: bool = False
    """Replace an existing run."""
    resume: bool = False
    """Continue the run in --out."""
    chunk: C = dataclasses.field(default_factory=ChunkConfig)  # type: ignore[assignment]
    """Horizons, observation keys and their encoder (--chunk.encoder.type lowdim | multimodal)."""
    policy: P = choice(POLICY_TYPES, "diffusion")
    """The policy (--policy.type diffusion | gaussian | vae)."""
    algo: A = choice(ALGO_TYPES, "bc")
    """The algorithm (--algo.type bc | diffusion-ql | td3-bc | qc | idql | fql | dsrl | dppo)."""
    source: S = choice(SOURCE_TYPES, "offline")
    """Where batches come from (--source.type offline | online | rollout)."""
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    """Device, precision, gradient handling and training states."""

    def __post_init__(self) -> None:
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite exclude each other: resume keeps the run, overwrite deletes it")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"--steps and --batch-size must be >= 1, got {self.steps} and {self.batch_size}")
        if self.seed < 0 or self.eval_episodes < 0 or self.eval_seed < 0 or self.eval_envs < 1:
            raise ValueError(
                f"need --seed >= 0, --eval-episodes >= 0, --eval-seed >= 0 and --eval-envs >= 1; got {self.seed}, "
                f"{self.eval_episodes}, {self.eval_seed} and {self.eval_envs}"
            )
        needs = ALGOS[self.algo_type][2]
        if needs is not None and self.policy_type != needs:
            raise ValueError(
                f"--algo.type {self.algo_type} trains a {needs} policy; got --policy.type {self.policy_type} "
                f"(pass --policy.type {needs})"
            )
        if self.batches != "windows" and self.chunk.aux_state:
            raise ValueError(f"--chunk.aux-state: an auxiliary state loss is for --algo.type bc, not {self.algo_type}")
        if self.batches != "windows" and self.chunk.pad_after is not None:
            raise ValueError(
                f"--chunk.pad-after: for --algo.type bc; RL chunk transitions keep Ta - 1 (got {self.algo_type})"
            )
        if (self.batches == "rollouts") != isinstance(self.source, RolloutConfig):
            raise ValueError(
                f"--algo.type {self.algo_type} with --source.type {type_name(self.source, SOURCE_TYPES)}: on-policy "
                "rollouts are for --algo.type dppo, and dppo trains only on them (pass both or neither)"
            )
        if self.online and self.batches != "transitions":
            raise ValueError(
                "--source.type online trains an actor-critic: pass --algo.type diffusion-ql, qc, idql, fql, dsrl or "
                "td3-bc"
            )
        if self.online and self.source.bc_data != "replay" and self.algo_type not in SELF_IMITATING:
            raise ValueError(
                f"--source.bc-data {self.source.bc_data} is an option of {', '.join(SELF_IMITATING)}; "
                f"got {self.algo_type}"
            )
        if self.online and self.source.bc_data != "replay" and getattr(self.algo, "bc_weighting", "none") != "none":
            raise ValueError("--algo.bc-weighting advantage weights the replay batch: use --source.bc-data replay")
        if self.online and self.source.offline_items(self.batch_size) >= self.batch_size:
            raise ValueError(
                f"--source.offline-share {self.source.offline_share} leaves no replay item in a batch of "
                f"{self.batch_size}; lower it or raise --batch-size"
            )
        if self.online and self.batch_size % self.engine.accumulate:
            raise ValueError(
                f"--batch-size {self.batch_size} must be divisible by --engine.accumulate {self.engine.accumulate}"
            )
        if isinstance(self.source, OfflineConfig) and self.source.cache_images and self.batches != "windows":
            raise ValueError("--source.cache-images is for behaviour cloning's windows; RL transitions read the store")

    def inapplicable(self) -> dict[str, str]:
        """{field: why} of this config's own fields that the chosen types ignore: the CLI hides them from --help
        and refuses their flags (a preset's value is kept, unused)."""
        if self.batches == "rollouts":
            why = (
                f"--algo.type {self.algo_type} trains on whole rollouts (--source.n-envs x --source.decisions), "
                "in minibatches of --algo.minibatch"
            )
            return {"batch_size": why}
        return {}

    @property
    def policy_type(self) -> str:
        return type_name(self.policy, POLICY_TYPES)

    @property
    def algo_type(self) -> str:
        return type_name(self.algo, ALGO_TYPES)

    @property
    def batches(self) -> str:
        """What the algorithm trains on: "windows" (behaviour cloning), "transitions" (RL) or "rollouts" (on-policy)."""
        return getattr(ALGOS[self.algo_type][0], "batches", "windows")

    @property
    def online(self) -> bool:
        return isinstance(self.source, OnlineConfig)


def flat(d: dict, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted key: value}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out
