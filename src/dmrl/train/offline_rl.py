"""Offline actor-critic training (Diffusion-QL, TD3+BC) on an episode store's rewards: the BC trainer's loop, with
chunk transitions for data and the algorithm's ``update()`` (critic, actor, targets) in place of one loss.

The run directory is the BC one (config.json, metrics.jsonl, tb/, state/, checkpoint/): checkpoint/ holds the
exported actor alone, a plain policy checkpoint that ``dmrl eval`` loads without any critic; the resumable
states in state/ hold the whole algorithm (actor, EMA / target actor, critic, target critic, both optimizers).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from torch import nn
from tqdm import tqdm

from dmrl.algos import ALGOS, ChunkCritic
from dmrl.config import TrainConfig, to_dict
from dmrl.data import ChunkTransitionDataset, EpisodeStore, SequenceDataset, split_episodes
from dmrl.policies import ChunkPolicy
from dmrl.train.checkpoint import load_policy, save_policy
from dmrl.train.engine import Engine, load_latest_state, save_state, shutdown_distributed
from dmrl.train.logging import RunLog
from dmrl.train.offline import (
    _flat,
    _prepare_out,
    build_from_store,
    env_kwargs_from_store,
    make_loader,
    validation_loss,
)


def train_offline_rl(cfg: TrainConfig, progress: bool = True) -> dict[str, Any]:
    """Train ``cfg.algo``, save ``out/checkpoint`` (the actor) and return a summary, as ``train_bc`` does."""
    if cfg.algo not in ALGOS:
        raise ValueError(f"train_offline_rl: --algo {cfg.algo!r} is not an offline-RL algorithm ({', '.join(ALGOS)})")
    store = EpisodeStore.open(cfg.dataset)
    engine = Engine(cfg.engine, cfg.seed)
    try:
        if engine.dist.enabled:
            raise ValueError(f"--algo {cfg.algo} runs in one process for now: launch it without torchrun")
        return _train(cfg, store, engine, progress)
    finally:
        shutdown_distributed()


def load_init(actor: ChunkPolicy, path: Path) -> None:
    """Copy a saved policy's weights (normaliser statistics included) into ``actor``; settings must match."""
    init, _ = load_policy(path)
    if init.name != actor.name:
        raise ValueError(f"--init {path}: a {init.name} policy, but this run trains a {actor.name} actor")
    mine = _flat({"chunk": to_dict(actor.chunk), actor.name: to_dict(actor.config), "obs_dims": actor.obs_dims})
    theirs = _flat({"chunk": to_dict(init.chunk), init.name: to_dict(init.config), "obs_dims": init.obs_dims})
    mine["action_dim"], theirs["action_dim"] = actor.action_dim, init.action_dim
    for key in sorted(set(mine) | set(theirs)):
        if not key.endswith(".pretrained") and mine.get(key) != theirs.get(key):  # ViT weights come from the file
            raise ValueError(
                f"--init {path}: its {key} is {theirs.get(key)!r} but this run has {mine.get(key)!r}; "
                "pass the checkpoint's settings"
            )
    actor.load_state_dict(init.state_dict())


def build_algo(cfg: TrainConfig, store: EpisodeStore, engine: Engine) -> nn.Module:
    """cfg.algo's algorithm: the actor (shaped by the store, weights from --init if given) and a fresh critic."""
    actor, _ = build_from_store(cfg, store)
    if cfg.init is not None:
        load_init(actor, cfg.init)
    # Both on the device before the algorithm copies them into targets and hands them to its optimizers.
    actor.to(engine.device)
    critic = ChunkCritic(actor, cfg.critic).to(engine.device)  # after --init: it copies the actor's statistics
    cls = ALGOS[cfg.algo][0]
    if cfg.algo == "diffusion-ql":
        return cls(actor, critic, cfg.diffusion_ql, engine, ema_decay=cfg.ema_decay)
    return cls(actor, critic, cfg.td3_bc, engine)


def restore_algo_state(cfg: TrainConfig, out: Path, algo: nn.Module, engine: Engine, unit: str) -> tuple[int, dict]:
    """With --resume, load the newest state of ``out`` into algo, its optimizers and the engine; -> (step, last log)."""
    state = load_latest_state(out, engine.dist, cfg.seed) if cfg.resume else None
    if state is None:
        return 0, {}
    algo.load_state_dict(state.tensors["algo"])
    for name, opt in algo.optimizers.items():
        opt.load_state_dict(state.objects["optimizers"][name])
    engine.load_state_dict(state.objects["engine"])
    algo.n_updates = state.objects["n_updates"]
    print(f"resuming {out} from {state.path.name} ({unit} {state.step} of {cfg.steps})", flush=True)
    return state.step, state.objects["last_log"]


def save_algo_state(cfg: TrainConfig, out: Path, step: int, algo: nn.Module, engine: Engine, last_log: dict) -> None:
    """A resumable state of the whole algorithm (actor, critic, targets, optimizers) and the engine at ``step``."""
    objects = {
        "optimizers": {name: opt.state_dict() for name, opt in algo.optimizers.items()},
        "engine": engine.state_dict(),
        "n_updates": algo.n_updates,
        "last_log": last_log,
    }
    save_state(out, step, engine.dist, {"algo": algo.state_dict()}, objects, cfg.engine.keep_last)


def _train(cfg: TrainConfig, store: EpisodeStore, engine: Engine, progress: bool) -> dict[str, Any]:
    out = _prepare_out(cfg, engine)
    train_eps, val_eps = split_episodes(store.n_episodes, cfg.val_fraction, cfg.seed)
    algo = build_algo(cfg, store, engine)
    engine.prepare(algo)  # every trainable weight of actor and critic is what the engine clips
    c = cfg.chunk
    ds_kw = dict(obs_keys=c.obs_keys, horizon_obs=c.n_obs_steps, horizon_pred=c.horizon, horizon_exec=c.n_action_steps)
    train_ds = ChunkTransitionDataset(store, episodes=train_eps, **ds_kw)
    val_ds = SequenceDataset(store, episodes=val_eps, **ds_kw) if len(val_eps) else None
    start, summary = restore_algo_state(cfg, out, algo, engine, "step")

    def save(step: int) -> None:
        save_algo_state(cfg, out, step, algo, engine, summary)

    acc = cfg.engine.accumulate
    loader = make_loader(train_ds, cfg, engine, start)
    log = RunLog(out, start)
    curve_env = (store.attrs["env_id"], env_kwargs_from_store(store))  # for --curve-every
    bar = tqdm(total=cfg.steps, initial=start, desc=f"train {cfg.algo}", disable=not progress, unit="step")
    batches, t0, step = iter(loader), time.perf_counter(), start
    try:
        while step < cfg.steps:
            micro = []
            for _ in range(acc):
                batch = engine.to_device(next(batches))
                batch["progress"] = step / cfg.steps
                micro.append(batch)
            logs = algo.update(micro)
            logs["td_error"] = float(logs.pop("td_error").mean())  # per-item (B,): logged as its batch mean
            step += 1
            if step % 50 == 0 or step == cfg.steps:
                rec = {
                    "step": step,
                    **logs,
                    "samples_per_s": (step - start) * cfg.batch_size / (time.perf_counter() - t0),
                }
                if val_ds is not None and (step % cfg.val_every == 0 or step == cfg.steps):
                    rec["val_loss"] = validation_loss(algo.policy, val_ds, cfg, engine.device)
                log.write(rec)
                bar.set_postfix(critic_loss=f"{rec['critic_loss']:.4f}")
                summary = rec
            bar.update(1)
            if engine.is_main and cfg.curve_every and step % cfg.curve_every == 0:
                from dmrl.train.evaluate import curve_point

                t_curve = time.perf_counter()
                point = curve_point(algo.evaluation_policy(), *curve_env, cfg, engine.device)
                log.write({"step": step, **point})
                t0 += time.perf_counter() - t_curve  # train_seconds and samples/s count training only
            if cfg.engine.save_every and step % cfg.engine.save_every == 0 and step < cfg.steps:
                save(step)
    except KeyboardInterrupt:
        if step > start:  # keep the progress since the last state (see train_bc)
            save(step)
        raise
    finally:
        bar.close()
        log.close()
    save(step)
    meta = {
        "env_id": store.attrs["env_id"],
        "env_kwargs": env_kwargs_from_store(store),
        "dataset": str(cfg.dataset),
        "algo": cfg.algo,
        "init": str(cfg.init) if cfg.init is not None else None,
        "train_steps": step,
        "train_seconds": time.perf_counter() - t0,
        "device": str(engine.device),
        "precision": engine.precision,
        "world_size": engine.dist.world_size,
    }
    summary = {**summary, **meta}
    save_policy(out / "checkpoint", algo.policy, meta)
    if cfg.eval_episodes > 0:
        from dmrl.train.evaluate import evaluate

        seeds = list(range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes))
        policy = algo.evaluation_policy().cpu()  # best-of-N with the critic when diffusion_ql.n_action_samples > 1
        result = evaluate(policy, store.attrs["env_id"], seeds, meta["env_kwargs"], n_envs=cfg.eval_envs)
        summary["eval"] = result.summary()
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
