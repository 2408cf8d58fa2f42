"""The offline data source: an episode store's windows (behaviour cloning) or chunk transitions (offline RL),
in the global order the engine's sampler gives every rank, with a validation loss and learning-curve points."""

from __future__ import annotations

import ast
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from dmrl.data import (
    ChunkTransitionDataset,
    EpisodeStore,
    SequenceDataset,
    StoreError,
    fit_normalizer,
    require_finite,
    split_episodes,
)
from dmrl.envs import env_spec
from dmrl.policies import ChunkPolicy, build_policy
from dmrl.policies.observations import TEXT_KEYS, VECTOR_KEYS, obs_dims_from_spec
from dmrl.train.config import OfflineConfig, TrainConfig
from dmrl.train.engine import Engine, GlobalBatchSampler
from dmrl.train.engine.device import fork_rng


class OfflineSource:
    """Batches of the store's training episodes, one per step (this rank's share of the global batch), endless.

    Behaviour cloning reads SequenceDataset windows; actor-critic algorithms read ChunkTransitionDataset items
    (Ta-step rewards, next observations). A held-out share of episodes gives the validation loss.
    """

    log_every = 50

    def __init__(self, cfg: TrainConfig, store: EpisodeStore, engine: Engine) -> None:
        src: OfflineConfig = cfg.source
        self.cfg, self.src, self.store, self.engine = cfg, src, store, engine
        self.train_eps, val_eps = split_episodes(store.n_episodes, src.val_fraction, cfg.seed)
        c = cfg.chunk
        ds_kw: dict[str, Any] = dict(
            obs_keys=(*c.obs_keys, "state") if c.aux_state else c.obs_keys,  # state: aux targets, never an input
            n_obs_steps=c.n_obs_steps,
            horizon=c.horizon,
            n_action_steps=c.n_action_steps,
        )
        if cfg.batches == "windows":
            self.train_ds: Any = SequenceDataset(
                store, episodes=self.train_eps, cache_images=src.cache_images, pad_after=c.pad_after, **ds_kw
            )
        else:
            self.train_ds = ChunkTransitionDataset(store, episodes=self.train_eps, **ds_kw)
        # The validation set is a few batches: read from the store, not a second in-memory copy of every image.
        val = len(val_eps) and engine.is_main
        self.val_ds = SequenceDataset(store, episodes=val_eps, pad_after=c.pad_after, **ds_kw) if val else None
        self.curve_env = (store.attrs["env_id"], env_kwargs_from_store(store))
        self.batches: Any = None

    def start(self, algo: Any, start_step: int) -> None:
        self.batches = iter(make_loader(self.train_ds, self.cfg, self.engine, start_step))

    def exhausted(self) -> bool:
        return False

    def events(self, step: int) -> list[dict]:
        return []

    def next_batch(self, step: int) -> dict:
        batch = self.engine.to_device(next(self.batches))
        batch["progress"] = step / self.cfg.steps
        return batch

    def after_update(self, step: int, logs: dict, algo: Any) -> None:
        pass

    def rates(self, steps: int, seconds: float) -> dict[str, float]:
        return {"samples_per_s": steps * self.cfg.batch_size / seconds}

    def validation(self, step: int, algo: Any) -> dict[str, float]:
        """The exported policy's loss on held-out episodes, every val_every steps and at the last."""
        if self.val_ds is None or not (step % self.src.val_every == 0 or step == self.cfg.steps):
            return {}
        return {"val_loss": validation_loss(algo.policy, self.val_ds, self.cfg.batch_size, self.engine.device)}

    def curve(self, step: int, algo: Any) -> dict[str, float] | None:
        """A learning-curve point every curve_every steps (closed-loop episodes of the evaluation policy)."""
        if not (self.src.curve_every and step % self.src.curve_every == 0):
            return None
        from dmrl.train.evaluate import curve_point

        seeds = list(range(self.cfg.eval_seed, self.cfg.eval_seed + self.src.curve_episodes))
        return curve_point(algo.evaluation_policy(), *self.curve_env, seeds, self.cfg.eval_envs, self.engine.device)

    def eval_env_kwargs(self) -> dict[str, Any]:
        return dict(self.curve_env[1])

    def meta(self) -> dict[str, Any]:
        # Which episodes and how many windows it trained on (chunk.pad_after changes the count).
        return {"train_episodes": len(self.train_eps), "train_windows": len(self.train_ds)}

    def close(self) -> None:
        pass


def build_from_store(cfg: TrainConfig, store: EpisodeStore) -> tuple[ChunkPolicy, dict]:
    """The policy ``cfg.policy`` configures, shaped by ``store``'s obs_spec, with normaliser statistics fitted on it.

    Only vector keys and actions get statistics: images and instructions go raw to their encoders (policies.base).
    """
    keys = cfg.chunk.obs_keys
    for k in keys:
        if k not in TEXT_KEYS:
            store.array(k)  # a one-line StoreError if the store lacks the modality
        elif k not in store.obs_modes:
            raise StoreError(
                f"dmrl store {store.path}: no modality {k!r} (store has: {', '.join(store.obs_modes)}); "
                f"collect with --obs-modes including {k}"
            )
    obs_dims = obs_dims_from_spec(store.obs_spec, keys)
    aux = ["state"] if cfg.chunk.aux_state else []  # the auxiliary head's targets (never an input)
    if aux:
        store.array("state")  # a one-line StoreError if the store was collected without state
    fitted = [*(k for k in keys if k in VECTOR_KEYS), *aux, "actions"]
    norm = fit_normalizer(store, fitted, mode="limits")  # NonFiniteError at a NaN/inf of a fitted key
    for k in keys:  # float keys the policy reads raw (depth): the same check, one chunk at a time; rgb is uint8
        if k not in TEXT_KEYS and k not in fitted:
            require_finite(store, k)
    policy = build_policy(cfg.policy_type, cfg.chunk, cfg.policy, obs_dims, store.action_dim, norm)
    return policy, obs_dims


def env_kwargs_from_store(store: EpisodeStore) -> dict[str, Any]:
    """The env settings the store was collected with that shape observations (image size, cameras, cups) and
    rewards, so evaluation renders what the policy was trained on and online collectors add rewards of the same kind
    as the dataset's. Paraphrases and obs modes are the evaluator's choice. A MultiPath store collected before the
    ``reward`` option existed holds rewards of ``shaped_v1``."""
    collect = store.attrs.get("collect", {})  # written by `dmrl collect`, every value as str
    out: dict[str, Any] = {}
    try:
        if "image_size" in collect:
            out["image_size"] = int(collect["image_size"])
        if "cameras" in collect:
            out["cameras"] = tuple(ast.literal_eval(collect["cameras"]))  # str of a tuple: literals only, no eval
        if "n_objects" in collect:
            out["n_objects"] = int(collect["n_objects"])
        if "reward" in collect:
            out["reward"] = str(collect["reward"])
        elif collect and "reward" in (env_spec(store.attrs["env_id"]).options or ()):
            out["reward"] = "shaped_v1"
    except (ValueError, SyntaxError):
        raise ValueError(f"dmrl store {store.path}: unreadable 'collect' attributes {collect}") from None
    return out


def make_loader(ds: Any, cfg: TrainConfig, engine: Engine, start_step: int) -> DataLoader:
    """This rank's batch of ``ds`` for every global step from ``start_step`` on (endless; see GlobalBatchSampler)."""
    sampler = GlobalBatchSampler(len(ds), cfg.batch_size, cfg.engine.accumulate, engine.dist, cfg.seed, start_step)
    return DataLoader(
        ds,
        batch_sampler=sampler,
        num_workers=cfg.source.num_workers,
        multiprocessing_context=engine.worker_start_method if cfg.source.num_workers else None,
        pin_memory=engine.pin_memory,
        # Its own generator: starting an iterator draws a worker base seed, which must not come from (and so
        # shift) the global stream that the training noise and a resumed run's restored RNG state share.
        generator=torch.Generator().manual_seed(cfg.seed),
    )


@torch.no_grad()
def validation_loss(
    policy: ChunkPolicy, ds: SequenceDataset, batch_size: int, device: torch.device, max_batches: int = 8
) -> float:
    """Mean loss of ``policy`` over up to ``max_batches`` validation batches, with fixed noise draws."""
    loader = DataLoader(ds, batch_size=min(batch_size, len(ds)), shuffle=False)
    losses = []
    # fork_rng: the same diffusion timesteps/noise every time (comparable curves) without moving the training
    # RNG streams, which exact resume depends on.
    with fork_rng(device):
        torch.manual_seed(1234)
        for i, batch in enumerate(loader):
            if i >= max_batches:
                break
            losses.append(float(policy.loss({**_move(batch, device), "progress": 1.0})["loss"]))
    return float(np.mean(losses))


def _move(batch: dict, device: torch.device) -> dict:
    return {
        k: _move(v, device) if isinstance(v, dict) else v.to(device) if torch.is_tensor(v) else v
        for k, v in batch.items()
    }
