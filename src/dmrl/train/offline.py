"""Behaviour cloning of a chunk policy from an episode store: AdamW, warm-up + cosine LR, EMA, JSONL/TensorBoard logs.

The EMA weights are what gets validated, evaluated and saved as the policy (Diffusion Policy's recipe).
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from dmrl.config import TrainConfig, to_dict
from dmrl.data import EpisodeStore, SequenceDataset, fit_normalizer, split_episodes
from dmrl.policies import ChunkPolicy, build_policy
from dmrl.train.checkpoint import save_policy
from dmrl.train.engine import configure_cpu_threads, resolve_device, seed_everything


class EMA:
    """Exponential moving average of a module's parameters (buffers copied), warmed up as (1+k)/(10+k)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = decay
        self.updates = 0

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        ema_p = list(self.model.parameters())
        torch._foreach_lerp_(ema_p, [p.detach() for p in model.parameters()], 1.0 - d)
        for b_ema, b in zip(self.model.buffers(), model.buffers(), strict=True):
            b_ema.copy_(b)


def _lr_lambda(cfg: TrainConfig):
    warm = max(1, cfg.optim.warmup_steps)

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, cfg.steps - warm)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def _to(batch: dict, device: torch.device) -> dict:
    return {
        k: _to(v, device) if isinstance(v, dict) else v.to(device) if torch.is_tensor(v) else v
        for k, v in batch.items()
    }


def _prepare_out(cfg: TrainConfig) -> Path:
    out = Path(cfg.out)
    if out.exists() and any(out.iterdir()):
        if not cfg.overwrite:
            raise FileExistsError(f"run directory {out} exists; pass --overwrite or choose another --out")
        if not (out / "config.json").is_file():
            raise FileExistsError(f"--overwrite refuses to delete {out}: it is not a dmrl run directory")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def build_from_store(cfg: TrainConfig, store: EpisodeStore) -> tuple[ChunkPolicy, dict[str, int]]:
    """The policy named by ``cfg.policy`` with normaliser statistics fitted on ``store``."""
    keys = cfg.chunk.obs_keys
    for k in keys:
        store.array(k)  # a one-line StoreError if the store lacks the modality
    obs_dims = {k: int(np.prod(store.obs_spec[k][0])) for k in keys}
    norm = fit_normalizer(store, [*keys, "actions"], mode="limits")
    policy = build_policy(cfg.policy, cfg.chunk, cfg.policy_config, obs_dims, store.action_dim, norm)
    return policy, obs_dims


def train_bc(cfg: TrainConfig, progress: bool = True) -> dict[str, Any]:
    """Train, save ``out/checkpoint`` and return a summary (final losses, samples/s, optional evaluation)."""
    store = EpisodeStore.open(cfg.dataset)
    device = resolve_device(cfg.device)
    configure_cpu_threads(cfg.cpu_threads)
    seed_everything(cfg.seed)
    out = _prepare_out(cfg)
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    train_eps, val_eps = split_episodes(store.n_episodes, cfg.val_fraction, cfg.seed)
    policy, _ = build_from_store(cfg, store)
    policy.to(device).train()
    c = cfg.chunk
    ds_kw = dict(obs_keys=c.obs_keys, horizon_obs=c.n_obs_steps, horizon_pred=c.horizon, horizon_exec=c.n_action_steps)
    train_ds = SequenceDataset(store, episodes=train_eps, **ds_kw)
    val_ds = SequenceDataset(store, episodes=val_eps, **ds_kw) if len(val_eps) else None
    loader = DataLoader(
        train_ds,
        batch_size=min(cfg.batch_size, len(train_ds)),
        shuffle=True,
        drop_last=True,
        num_workers=cfg.num_workers,
        persistent_workers=cfg.num_workers > 0,
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    ema = EMA(policy, cfg.ema_decay)
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out / "tb"))
    log = (out / "metrics.jsonl").open("a")
    bar = tqdm(total=cfg.steps, desc=f"train {cfg.policy}", disable=not progress, unit="step")
    step, t0, summary = 0, time.perf_counter(), {}
    try:
        while step < cfg.steps:
            for batch in loader:
                batch = _to(batch, device)
                batch["progress"] = step / cfg.steps
                losses = policy.loss(batch)
                opt.zero_grad(set_to_none=True)
                losses["loss"].backward()
                if cfg.optim.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.optim.grad_clip)
                opt.step()
                sched.step()
                ema.update(policy)
                step += 1
                if step % 50 == 0 or step == cfg.steps:
                    rec = {
                        "step": step,
                        "lr": sched.get_last_lr()[0],
                        **{k: float(v.detach()) for k, v in losses.items()},
                        "samples_per_s": step * cfg.batch_size / (time.perf_counter() - t0),
                    }
                    if val_ds is not None and (step % cfg.val_every == 0 or step == cfg.steps):
                        rec["val_loss"] = validation_loss(ema.model, val_ds, cfg, device)
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                    for k, v in rec.items():
                        if k != "step":
                            writer.add_scalar(k, v, step)
                    bar.set_postfix(loss=f"{rec['loss']:.4f}")
                    summary = rec
                bar.update(1)
                if step >= cfg.steps:
                    break
    finally:
        bar.close()
        log.close()
        writer.close()
    meta = {
        "env_id": store.attrs["env_id"],
        "dataset": str(cfg.dataset),
        "train_steps": step,
        "train_seconds": time.perf_counter() - t0,
    }
    save_policy(out / "checkpoint", ema.model, meta)
    summary = {**summary, **meta}
    if cfg.eval_episodes > 0:
        from dmrl.train.evaluate import evaluate

        seeds = list(range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes))
        result = evaluate(ema.model.cpu(), store.attrs["env_id"], seeds, n_envs=cfg.eval_envs)
        summary["eval"] = result.summary()
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


@torch.no_grad()
def validation_loss(
    policy: ChunkPolicy, ds: SequenceDataset, cfg: TrainConfig, device: torch.device, max_batches: int = 8
) -> float:
    """Mean loss of ``policy`` over up to ``max_batches`` validation batches, with fixed noise draws."""
    state = torch.get_rng_state()
    torch.manual_seed(1234)  # the same diffusion timesteps/noise every time, so curves are comparable
    loader = DataLoader(ds, batch_size=min(cfg.batch_size, len(ds)), shuffle=False)
    losses = []
    for i, batch in enumerate(loader):
        if i >= max_batches:
            break
        losses.append(float(policy.loss({**_to(batch, device), "progress": 1.0})["loss"]))
    torch.set_rng_state(state)
    return float(np.mean(losses))
