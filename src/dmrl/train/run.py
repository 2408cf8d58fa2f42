"""The one training loop: prepare the run directory, build the algorithm, resume, step, log, save, finish.

Behaviour cloning, offline RL and online RL all run here; they differ in the algorithm (``--algo.type``: whose
``update(batch)`` is one optimizer step) and in where batches come from (``--source.type``: the episode store's
windows, or a replay buffer that collector processes fill), as in acme, where offline vs online is the data source,
not a second trainer. The run directory holds config.json, metrics.jsonl, tb/, state/ (resumable states of the whole
algorithm: networks, targets, optimizers, schedules, RNGs) and checkpoint/ (the exported policy alone, which
``dmrl eval`` loads without any critic).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm import tqdm

from dmrl.algos import ALGOS
from dmrl.config_utils import choices, to_dict, type_name
from dmrl.data import EpisodeStore
from dmrl.paths import check_output_path
from dmrl.policies import ChunkPolicy
from dmrl.policies.checkpoint import load_policy, save_policy
from dmrl.train.config import TrainConfig, flat
from dmrl.train.engine import Engine, load_latest_state, save_state, shutdown_distributed
from dmrl.train.engine.distributed import barrier
from dmrl.train.finite import FiniteWatch
from dmrl.train.logging import RunLog
from dmrl.train.offline import OfflineSource, build_from_store, env_kwargs_from_store

log = logging.getLogger(__name__)

#: Settings a resumed run may change: where and how often it evaluates, saves and loads, not what it trains.
RESUME_MAY_DIFFER = {
    "resume",
    "overwrite",
    "eval_episodes",
    "eval_envs",
    "eval_seed",
    "source.curve_every",
    "source.curve_episodes",
    "source.num_workers",
    "source.cache_images",
    "engine.device",
    "engine.cpu_threads",
    "engine.compile",
    "engine.save_every",
    "engine.keep_last",
}


class DataSource(Protocol):
    """Where the loop's batches come from: OfflineSource (dmrl.train.offline), OnlineSource (dmrl.train.online) or
    RolloutSource (dmrl.train.onpolicy: one fresh on-policy rollout per update)."""

    log_every: int  # updates between metric records

    def start(self, algo: Any, start_step: int) -> None: ...  # loaders, or rings + collector processes

    def exhausted(self) -> bool: ...  # online: the env-step budget is spent

    def events(self, step: int) -> list[dict]: ...  # records to log now (collector restarts, evaluations)

    def next_batch(self, step: int) -> dict | None: ...  # on the device; None: not ready yet (replay filling)

    def after_update(self, step: int, logs: dict, algo: Any) -> None: ...  # PER priorities, publishing

    def rates(self, steps: int, seconds: float) -> dict[str, float]: ...  # throughput since the (re)start

    def validation(self, step: int, algo: Any) -> dict[str, float]: ...  # held-out loss when due

    def curve(self, step: int, algo: Any) -> dict[str, float] | None: ...  # a learning-curve point when due

    def meta(self) -> dict[str, Any]: ...  # for the checkpoint's meta and the summary

    def eval_env_kwargs(self) -> dict[str, Any]: ...  # the env the final evaluation runs

    def close(self) -> None: ...  # idempotent: stop children, free shared memory

    # Optional (OnlineSource has them; a source without them has no state beyond the algorithm's):
    #   write_state(state_dir)  writes its own files into a training state being saved (the replay rings)
    #   restore(state_dir)      called before start() on --resume with the state loaded
    #   halt()                  stops its children but keeps what write_state needs (Ctrl-C's final save)


def train(cfg: TrainConfig, progress: bool = True, hook: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Train, save ``out/checkpoint`` and return a summary (last logged metrics, meta, optional evaluation).

    Runs alone or as one rank under torchrun (behaviour cloning; see dmrl.train.engine): only rank 0 logs and
    writes files. ``hook(info)`` (online tests) is called every loop iteration with the source's state.
    """
    check_output_path(cfg.out)  # before any work: an unusable --out is a one-line error, nothing created
    if cfg.init is not None and not (Path(cfg.init) / "config.json").is_file():
        raise FileNotFoundError(f"--init {cfg.init}: not a policy checkpoint directory (a run's checkpoint/)")
    if cfg.algo_type == "dsrl" and cfg.init is None and not cfg.resume:
        # Steering the noise of an untrained policy steers noise into noise: nothing to learn from.
        raise ValueError("--algo.type dsrl steers a trained diffusion policy, frozen: pass --init <its checkpoint/>")
    store = EpisodeStore.open(cfg.dataset)
    engine = Engine(cfg.engine, cfg.seed)
    try:
        if engine.dist.enabled and cfg.algo_type != "bc":
            raise ValueError(f"--algo.type {cfg.algo_type} runs in one process for now: launch it without torchrun")
        return _train(cfg, store, engine, progress, hook)
    finally:
        shutdown_distributed()


def saved_settings(config_json: Path) -> dict[str, Any]:
    """A run's config.json as flat {dotted key: value}. A key added to TrainConfig after the run started is absent
    from it and takes its default, which is what that run trained with."""
    raw = json.loads(config_json.read_text())
    if isinstance(raw.get("policy"), str):
        raise ValueError(
            f"--resume: {config_json} was written by a dmrl before --policy.type (policy {raw['policy']!r}); "
            "this version cannot continue that run: start a new one"
        )
    return {**_flat_defaults(TrainConfig(), raw), **flat(raw)}


def _flat_defaults(cfg: Any, saved: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flat defaults of ``cfg`` where every choice field (nested ones too) takes the type ``saved`` names."""
    out: dict[str, Any] = {}
    tagged = choices(cfg)
    for f in dataclasses.fields(cfg):
        value, sub = getattr(cfg, f.name), saved.get(f.name) if isinstance(saved, dict) else None
        registry = tagged.get(f.name, {})
        if isinstance(sub, dict) and sub.get("type") in registry:
            value = registry[sub["type"]]()  # that type's defaults (another type has other fields)
        if dataclasses.is_dataclass(value):
            out |= _flat_defaults(value, sub if isinstance(sub, dict) else {}, f"{prefix}{f.name}.")
            if registry:
                out[f"{prefix}{f.name}.type"] = type_name(value, registry)
        else:
            out |= flat({f.name: to_dict(value)}, prefix)  # a dict value (denoiser_kwargs) flattens as in config.json
    return out


def first_difference(saved_path: Path, cfg: TrainConfig) -> tuple[str, Any, Any] | None:
    """The first setting, outside RESUME_MAY_DIFFER, in which ``cfg`` differs from the run whose config.json is
    ``saved_path``, as (key, cfg's value, the run's value); None when ``cfg`` may continue (or reuse) that run."""
    saved, now = saved_settings(saved_path), flat(to_dict(cfg))
    # The chosen types first: a run of another policy type differs in every field of it.
    for key in sorted(set(saved) | set(now), key=lambda k: (not k.endswith(".type"), k)):
        if key not in RESUME_MAY_DIFFER and saved.get(key) != now.get(key):
            return key, now.get(key), saved.get(key)
    return None


def prepare_out(cfg: TrainConfig, engine: Engine) -> Path:
    """The run directory: checked for --resume, emptied for --overwrite (rank 0 only), config.json written."""
    out = Path(cfg.out)
    if cfg.resume:
        saved_path = out / "config.json"
        if not saved_path.is_file():
            raise FileNotFoundError(f"--resume: {saved_path} not found; start the run without --resume first")
        if (diff := first_difference(saved_path, cfg)) is not None:
            key, now, saved = diff
            raise ValueError(
                f"--resume: {key} is {now!r} but the run in {out} used {saved!r}; "
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


def load_init(policy: ChunkPolicy, path: Path) -> None:
    """Copy a saved policy's weights (normaliser statistics included) into ``policy``; settings must match."""
    init, _ = load_policy(path)
    if init.name != policy.name:
        raise ValueError(f"--init {path}: a {init.name} policy, but this run trains a {policy.name} policy")
    mine = flat({"chunk": to_dict(policy.chunk), policy.name: to_dict(policy.config), "obs_dims": policy.obs_dims})
    theirs = flat({"chunk": to_dict(init.chunk), init.name: to_dict(init.config), "obs_dims": init.obs_dims})
    mine["action_dim"], theirs["action_dim"] = policy.action_dim, init.action_dim
    for key in sorted(set(mine) | set(theirs)):
        if not key.endswith(".pretrained") and mine.get(key) != theirs.get(key):  # ViT weights come from the file
            raise ValueError(
                f"--init {path}: its {key} is {theirs.get(key)!r} but this run has {mine.get(key)!r}; "
                "pass the checkpoint's settings"
            )
    policy.load_state_dict(init.state_dict())


def build_algo(cfg: TrainConfig, store: EpisodeStore, engine: Engine) -> torch.nn.Module:
    """cfg.algo's algorithm around the policy (shaped by the store, weights from --init if given); the algorithm
    builds what else it trains (an actor-critic's critic) and puts everything on the engine's device."""
    policy, _ = build_from_store(cfg, store)
    if cfg.init is not None:
        load_init(policy, cfg.init)
    # After --init: an actor-critic algorithm's new critic copies the policy's normaliser statistics.
    return ALGOS[cfg.algo_type][0].build(policy, cfg.algo, engine, cfg.steps)


def restore_state(cfg: TrainConfig, out: Path, algo: Any, engine: Engine) -> tuple[int, dict, Path | None]:
    """With --resume, load the newest state of ``out`` into the algorithm and the engine;
    -> (step, last log, its state directory)."""
    state = load_latest_state(out, engine.dist, cfg.seed) if cfg.resume else None
    if state is None:
        return 0, {}, None
    algo.load_state_dict(state.tensors["algo"])
    for name, opt in algo.optimizers.items():
        opt.load_state_dict(state.objects["optimizers"][name])
    for name, sched in getattr(algo, "schedulers", {}).items():
        sched.load_state_dict(state.objects["schedulers"][name])
    engine.load_state_dict(state.objects["engine"])
    algo.n_updates = state.objects["n_updates"]
    if engine.is_main:
        log.info("resuming %s from %s (step %d of %d)", out, state.path.name, state.step, cfg.steps)
    return state.step, state.objects["last_log"], state.path


def save_training_state(
    cfg: TrainConfig,
    out: Path,
    step: int,
    algo: Any,
    engine: Engine,
    last_log: dict,
    extra: Callable[[Path], None] | None = None,
) -> None:
    """A resumable state of the whole algorithm (networks, targets, optimizers, schedules) and the engine;
    ``extra(dir)`` adds the data source's own files (online: the replay) to the same state directory."""
    objects = {
        "optimizers": {name: opt.state_dict() for name, opt in algo.optimizers.items()},
        "schedulers": {name: s.state_dict() for name, s in getattr(algo, "schedulers", {}).items()},
        "engine": engine.state_dict(),
        "n_updates": algo.n_updates,
        "last_log": last_log,
    }
    save_state(out, step, engine.dist, {"algo": algo.state_dict()}, objects, cfg.engine.keep_last, extra)


def _scalars(logs: dict[str, Any], engine: Engine) -> dict[str, float]:
    """An update's logs as floats (per-item arrays by their mean), averaged over ranks."""
    return engine.mean_over_ranks(
        {k: float(np.mean(v)) if isinstance(v, np.ndarray) else float(v) for k, v in logs.items()}
    )


def _train(
    cfg: TrainConfig, store: EpisodeStore, engine: Engine, progress: bool, hook: Callable[[dict], None] | None
) -> dict[str, Any]:
    # Built before the run directory is touched: bad data (or a bad --init) fails with nothing written or deleted.
    algo = build_algo(cfg, store, engine)
    if cfg.online:
        from dmrl.train.online import OnlineSource

        source: DataSource = OnlineSource(cfg, store, engine, hook)
    elif cfg.batches == "rollouts":
        from dmrl.train.onpolicy import RolloutSource

        source = RolloutSource(cfg, store, engine)
    else:
        source = OfflineSource(cfg, store, engine)
    out = prepare_out(cfg, engine)
    main = engine.is_main
    start, summary, state_dir = restore_state(cfg, out, algo, engine)
    if state_dir is not None and hasattr(source, "restore"):
        source.restore(state_dir)  # online: the replay it had at that state, loaded before collectors start

    watch = FiniteWatch(enabled=engine.precision != "fp16")  # fp16: the loss scaler skips non-finite steps
    saved = [start or None]  # the newest state on disk, named in a non-finite error

    def save(step: int) -> None:
        watch.check(saved[0])  # never a non-finite state over a good one
        save_training_state(cfg, out, step, algo, engine, summary, getattr(source, "write_state", None))
        saved[0] = step

    run_log, bar, step = None, None, start
    try:
        source.start(algo, start)  # bad batch settings fail here, before anything is logged
        # A resumed run drops what the interrupted one logged after its last saved state.
        run_log = RunLog(out, start, enabled=main)
        desc = f"train {cfg.algo_type} {cfg.policy_type}"
        bar = tqdm(total=cfg.steps, initial=start, desc=desc, disable=not (progress and main), unit="step")
        t0 = time.perf_counter()
        while step < cfg.steps and not source.exhausted():
            for record in source.events(step):  # collector restarts, evaluations that finished
                run_log.write({"step": step, **record})
            batch = source.next_batch(step)
            if batch is None:  # online: the replay is still filling
                continue
            logs = algo.update(batch)
            step += 1
            watch.observe(step, logs)
            source.after_update(step, logs, algo)  # PER priorities, publishing the actor
            if step % source.log_every == 0 or step == cfg.steps:
                watch.check(saved[0])
                record = {
                    "step": step,
                    **_scalars(logs, engine),
                    **source.rates(step - start, time.perf_counter() - t0),
                }
                record |= source.validation(step, algo)
                run_log.write(record)
                bar.set_postfix({k: f"{record[k]:.4f}" for k in ("loss", "critic_loss") if k in record})
                summary = record
            bar.update(1)
            t_curve = time.perf_counter()
            if main and (point := source.curve(step, algo)):
                run_log.write({"step": step, **point})
                t0 += time.perf_counter() - t_curve  # train_seconds and samples/s count training only
            if cfg.engine.save_every and step % cfg.engine.save_every == 0 and step < cfg.steps:
                save(step)
        engine.check_replicas(algo.actor)
        save(step)  # before source.close(): an online source saves its replay with the state
    except KeyboardInterrupt:
        # Ctrl-C / SIGTERM: keep the progress made since the last state (one process only: a collective save
        # needs every rank, and torchrun stops them all). The RNG has moved past a half-done step, so the resumed
        # run is valid but not bit-identical to an uninterrupted one.
        getattr(source, "halt", source.close)()  # children stopped (an online replay stays readable)
        if not engine.dist.enabled and step > start:
            save(step)
        raise
    finally:
        source.close()
        if bar is not None:
            bar.close()
        if run_log is not None:
            run_log.close()
    meta = {
        "env_id": store.attrs["env_id"],
        "env_kwargs": env_kwargs_from_store(store),
        "dataset": str(cfg.dataset),
        "algo": cfg.algo_type,
        "init": str(cfg.init) if cfg.init is not None else None,
        "train_steps": step,
        "train_seconds": time.perf_counter() - t0,
        "device": str(engine.device),
        "precision": engine.precision,
        "world_size": engine.dist.world_size,
        **source.meta(),
    }
    summary = {**summary, **meta}
    if not main:
        return summary
    save_policy(out / "checkpoint", algo.policy, meta)
    if cfg.eval_episodes > 0:
        from dmrl.train.evaluate import evaluate

        seeds = list(range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes))
        policy = algo.evaluation_policy().cpu()  # best-of-N with the critic when diffusion-ql's n_action_samples > 1
        result = evaluate(policy, store.attrs["env_id"], seeds, source.eval_env_kwargs(), n_envs=cfg.eval_envs)
        summary["eval"] = result.summary()
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
