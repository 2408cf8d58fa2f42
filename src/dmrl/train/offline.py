"""Behaviour cloning of a chunk policy from an episode store: AdamW, warm-up + cosine LR, EMA, JSONL/TensorBoard logs.

The EMA weights are what gets validated, evaluated and saved as the policy (Diffusion Policy's recipe).
"""

from __future__ import annotations

import ast
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
from dmrl.data import EpisodeStore, SequenceDataset, StoreError, fit_normalizer, split_episodes
from dmrl.policies import ChunkPolicy, build_policy
from dmrl.policies.observations import TEXT_KEYS, VECTOR_KEYS, obs_dims_from_spec
from dmrl.train.checkpoint import save_policy
from dmrl.train.engine import Engine, GlobalBatchSampler, load_latest_state, save_state, shutdown_distributed
from dmrl.train.engine.device import fork_rng
from dmrl.train.engine.distributed import barrier
from dmrl.train.logging import RunLog


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
        # Frozen weights (a frozen MiniLM or ViT backbone: millions of them) never move, so they are not averaged.
        pairs = [(e, p) for e, p in zip(self.model.parameters(), model.parameters(), strict=True) if p.requires_grad]
        torch._foreach_lerp_([e for e, _ in pairs], [p.detach() for _, p in pairs], 1.0 - d)
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


_RESUME_MAY_DIFFER = {
    "resume",
    "overwrite",
    "eval_episodes",
    "eval_envs",
    "eval_seed",
    "curve_every",
    "curve_episodes",
    "num_workers",
    "engine.device",
    "engine.cpu_threads",
    "engine.compile",
    "engine.save_every",
    "engine.keep_last",
}


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def saved_settings(config_json: Path) -> dict[str, Any]:
    """A run's config.json as flat {dotted key: value}. A key added to TrainConfig after the run started is absent
    from it and takes its default, which is what that run trained with."""
    saved = _flat(json.loads(config_json.read_text()))
    return {**_flat(to_dict(TrainConfig())), **saved}


def _prepare_out(cfg: TrainConfig, engine: Engine) -> Path:
    """The run directory: checked for --resume, emptied for --overwrite (rank 0 only), config.json written."""
    out = Path(cfg.out)
    if cfg.resume:
        saved_path = out / "config.json"
        if not saved_path.is_file():
            raise FileNotFoundError(f"--resume: {saved_path} not found; start the run without --resume first")
        saved, now = saved_settings(saved_path), _flat(to_dict(cfg))
        for key in sorted(set(saved) | set(now)):
            if key not in _RESUME_MAY_DIFFER and saved.get(key) != now.get(key):
                raise ValueError(
                    f"--resume: {key} is {now.get(key)!r} but the run in {out} used {saved.get(key)!r}; "
                    "pass the run's own settings (see its config.json)"
                )
        return out
    if engine.is_main:
        if out.exists() and any(out.iterdir()):
            if not cfg.overwrite:
                raise FileExistsError(
                    f"run directory {out} exists; pass --resume to continue it, --overwrite to replace it, "
                    "or choose another --out"
                )
            if not (out / "config.json").is_file():
                raise FileExistsError(f"--overwrite refuses to delete {out}: it is not a dmrl run directory")
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    barrier(engine.dist)
    return out


def build_from_store(cfg: TrainConfig, store: EpisodeStore) -> tuple[ChunkPolicy, dict]:
    """The policy named by ``cfg.policy``, shaped by ``store``'s obs_spec, with normaliser statistics fitted on it.

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
    norm = fit_normalizer(store, [*(k for k in keys if k in VECTOR_KEYS), *aux, "actions"], mode="limits")
    policy = build_policy(cfg.policy, cfg.chunk, cfg.policy_config, obs_dims, store.action_dim, norm)
    return policy, obs_dims


def env_kwargs_from_store(store: EpisodeStore) -> dict[str, Any]:
    """The env settings that shape observations (image size, cameras, cups), as the store was collected with them,
    so evaluation renders what the policy was trained on. Paraphrases and obs modes are the evaluator's choice."""
    collect = store.attrs.get("collect", {})  # written by `dmrl collect`, every value as str
    out: dict[str, Any] = {}
    try:
        if "image_size" in collect:
            out["image_size"] = int(collect["image_size"])
        if "cameras" in collect:
            out["cameras"] = tuple(ast.literal_eval(collect["cameras"]))  # str of a tuple: literals only, no eval
        if "n_objects" in collect:
            out["n_objects"] = int(collect["n_objects"])
    except (ValueError, SyntaxError):
        raise ValueError(f"dmrl store {store.path}: unreadable 'collect' attributes {collect}") from None
    return out


def make_loader(ds: SequenceDataset, cfg: TrainConfig, engine: Engine, start_step: int) -> DataLoader:
    """This rank's micro-batches of ``ds`` from global step ``start_step`` on (endless; see GlobalBatchSampler)."""
    sampler = GlobalBatchSampler(len(ds), cfg.batch_size, cfg.engine.accumulate, engine.dist, cfg.seed, start_step)
    return DataLoader(
        ds,
        batch_sampler=sampler,
        num_workers=cfg.num_workers,
        multiprocessing_context=engine.worker_start_method if cfg.num_workers else None,
        pin_memory=engine.pin_memory,
        # Its own generator: starting an iterator draws a worker base seed, which must not come from (and so
        # shift) the global stream that the training noise and a resumed run's restored RNG state share.
        generator=torch.Generator().manual_seed(cfg.seed),
    )


def train_bc(cfg: TrainConfig, progress: bool = True) -> dict[str, Any]:
    """Train, save ``out/checkpoint`` and return a summary (final losses, samples/s, optional evaluation).

    Runs alone or as one rank under torchrun (see dmrl.train.engine); only rank 0 logs and writes files.
    """
    store = EpisodeStore.open(cfg.dataset)
    engine = Engine(cfg.engine, cfg.seed)
    try:
        return _train_bc(cfg, store, engine, progress)
    finally:
        shutdown_distributed()


def _train_bc(cfg: TrainConfig, store: EpisodeStore, engine: Engine, progress: bool) -> dict[str, Any]:
    out = _prepare_out(cfg, engine)
    main = engine.is_main
    train_eps, val_eps = split_episodes(store.n_episodes, cfg.val_fraction, cfg.seed)
    policy, _ = build_from_store(cfg, store)
    ema = EMA(policy, cfg.ema_decay)  # copied before compile / DDP wrap: a plain module, only ever evaluated
    model = engine.prepare(policy.train())
    ema.model.to(engine.device)
    c = cfg.chunk
    ds_kw = dict(
        obs_keys=(*c.obs_keys, "state") if c.aux_state else c.obs_keys,  # state: aux targets, not a policy input
        horizon_obs=c.n_obs_steps,
        horizon_pred=c.horizon,
        horizon_exec=c.n_action_steps,
        cache_images=cfg.cache_images,
        pad_after=c.pad_after,
    )
    train_ds = SequenceDataset(store, episodes=train_eps, **ds_kw)
    # The validation set is a few batches: read from the store, not a second in-memory copy of every image.
    val_kw = ds_kw | {"cache_images": False}
    val_ds = SequenceDataset(store, episodes=val_eps, **val_kw) if len(val_eps) and main else None
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    start, summary = 0, {}
    state = load_latest_state(out, engine.dist, cfg.seed) if cfg.resume else None
    if state is not None:
        policy.load_state_dict(state.tensors["model"])
        ema.model.load_state_dict(state.tensors["ema"])
        opt.load_state_dict(state.objects["optimizer"])
        sched.load_state_dict(state.objects["scheduler"])
        engine.load_state_dict(state.objects["engine"])
        ema.updates, start, summary = state.objects["ema_updates"], state.step, state.objects["last_log"]
        if main:
            print(f"resuming {out} from {state.path.name} (step {start} of {cfg.steps})", flush=True)

    def save(step: int) -> None:
        tensors = {"model": policy.state_dict(), "ema": ema.model.state_dict()}
        objects = {
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "engine": engine.state_dict(),
            "ema_updates": ema.updates,
            "last_log": summary,
        }
        save_state(out, step, engine.dist, tensors, objects, cfg.engine.keep_last)

    acc = cfg.engine.accumulate
    loader = make_loader(train_ds, cfg, engine, start)
    # A resumed run drops what the interrupted one logged after its last saved state.
    log = RunLog(out, start, enabled=main)
    curve_env = (store.attrs["env_id"], env_kwargs_from_store(store))  # for --curve-every
    bar = tqdm(total=cfg.steps, initial=start, desc=f"train {cfg.policy}", disable=not (progress and main), unit="step")
    batches, t0, step = iter(loader), time.perf_counter(), start
    try:
        while step < cfg.steps:
            totals: dict[str, float] = {}
            for k in range(acc):
                batch = engine.to_device(next(batches))
                batch["progress"] = step / cfg.steps
                losses = engine.forward_backward(model, batch, last=k == acc - 1)
                for name, v in losses.items():
                    totals[name] = totals.get(name, 0.0) + v.detach() / acc
            stats = engine.step(opt)
            sched.step()
            ema.update(policy)
            step += 1
            if step % 50 == 0 or step == cfg.steps:
                rec = engine.mean_over_ranks({k: float(v) for k, v in totals.items()})
                rec = {
                    "step": step,
                    "lr": sched.get_last_lr()[0],
                    **rec,
                    "grad_norm": float(stats["grad_norm"]),
                    "loss_scale": stats["loss_scale"],
                    "samples_per_s": (step - start) * cfg.batch_size / (time.perf_counter() - t0),
                }
                if val_ds is not None and (step % cfg.val_every == 0 or step == cfg.steps):
                    rec["val_loss"] = validation_loss(ema.model, val_ds, cfg, engine.device)
                log.write(rec)
                bar.set_postfix(loss=f"{rec['loss']:.4f}")
                summary = rec
            bar.update(1)
            if main and cfg.curve_every and step % cfg.curve_every == 0:
                from dmrl.train.evaluate import curve_point

                t_curve = time.perf_counter()
                log.write({"step": step, **curve_point(ema.model, *curve_env, cfg, engine.device)})
                t0 += time.perf_counter() - t_curve  # train_seconds and samples/s count training only
            if cfg.engine.save_every and step % cfg.engine.save_every == 0 and step < cfg.steps:
                save(step)
    except KeyboardInterrupt:
        # Ctrl-C: keep the progress made since the last state (one process only: a collective save needs every
        # rank, and torchrun stops them all). The RNG has moved past a half-done step, so the resumed run is
        # valid but not bit-identical to an uninterrupted one.
        if not engine.dist.enabled and step > start:
            save(step)
        raise
    finally:
        bar.close()
        log.close()
    engine.check_replicas(policy)
    save(step)
    meta = {
        "env_id": store.attrs["env_id"],
        "env_kwargs": env_kwargs_from_store(store),
        "dataset": str(cfg.dataset),
        "train_steps": step,
        "train_seconds": time.perf_counter() - t0,
        "device": str(engine.device),
        "precision": engine.precision,
        "world_size": engine.dist.world_size,
    }
    # Which episodes and how many windows it trained on (chunk.pad_after changes the count).
    summary = {**summary, **meta, "train_episodes": len(train_eps), "train_windows": len(train_ds)}
    if not main:
        return summary
    save_policy(out / "checkpoint", ema.model, meta)
    if cfg.eval_episodes > 0:
        from dmrl.train.evaluate import evaluate

        seeds = list(range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes))
        result = evaluate(ema.model.cpu(), store.attrs["env_id"], seeds, meta["env_kwargs"], n_envs=cfg.eval_envs)
        summary["eval"] = result.summary()
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


@torch.no_grad()
def validation_loss(
    policy: ChunkPolicy, ds: SequenceDataset, cfg: TrainConfig, device: torch.device, max_batches: int = 8
) -> float:
    """Mean loss of ``policy`` over up to ``max_batches`` validation batches, with fixed noise draws."""
    loader = DataLoader(ds, batch_size=min(cfg.batch_size, len(ds)), shuffle=False)
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
