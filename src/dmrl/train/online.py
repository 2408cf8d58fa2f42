"""Online actor-critic training (Diffusion-QL, TD3+BC) with asynchronous collectors (Ape-X, Horgan et al. 2018):
collector processes fill a shared replay ring with chunk transitions, the trainer samples it (PER) and updates.

The run directory is the offline one (config.json, metrics.jsonl, tb/, state/, checkpoint/ with the actor alone).
--dataset supplies the normaliser statistics and shapes (and --init the starting weights). Ctrl-C / SIGTERM: the
stop event ends every child, the state so far is saved, and the run can --resume (the replay ring starts empty).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmrl.algos import ALGOS
from dmrl.config import TrainConfig
from dmrl.data import ChunkTransitionDataset, EpisodeStore
from dmrl.data.replay import ReplayBuffer
from dmrl.train.checkpoint import save_policy
from dmrl.train.engine import Engine, shutdown_distributed
from dmrl.train.logging import RunLog
from dmrl.train.offline import _prepare_out, env_kwargs_from_store
from dmrl.train.offline_rl import build_algo, restore_algo_state, save_algo_state
from dmrl.train.online_workers import (
    WeightBoard,
    collector_main,
    evaluator_main,
    flat_weights,
    nest,
    prefill_replay,
    transition_spec,
)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM takes Ctrl-C's path: children stopped, state saved


class Collectors:
    """The collector processes: started, watched (a dead one is restarted with a fresh seed) and stopped."""

    def __init__(self, ctx: Any, args: Callable[[int, int], tuple], n: int) -> None:
        self.ctx, self.args, self.procs, self.restarts = ctx, args, [], 0
        for i in range(n):
            self.procs.append(self._start(i, i))

    def _start(self, index: int, seed: int) -> Any:
        p = self.ctx.Process(target=collector_main, args=self.args(index, seed), daemon=True, name=f"collector{index}")
        p.start()
        return p

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def restart_dead(self) -> list[dict[str, Any]]:
        """Restart every collector that died; one event record per restart."""
        events = []
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                self.restarts += 1
                seed = 1000 * self.restarts + i
                print(f"online: collector {i} (pid {p.pid}) died with exit code {p.exitcode}; restarting", flush=True)
                self.procs[i] = self._start(i, seed)
                events.append({"collector_restart": i, "exitcode": p.exitcode})
        return events


def stop_children(procs: list[Any], stop: Any, timeout: float = 10.0) -> None:
    """Set ``stop``, join each child for up to ``timeout`` s in all, terminate (then kill) the stragglers."""
    stop.set()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(2.0)
        if p.is_alive():
            p.kill()
            p.join()


def close_queues(*queues: Any) -> None:
    """Close queues whose reader is gone. A queue's feeder thread holds items not yet written to its pipe, and at
    interpreter exit the process waits for it to flush them: a weight snapshot larger than the pipe buffer, put
    after the evaluator's last read, would block exit forever. Unsent items are stale once the children stopped."""
    for q in queues:
        q.cancel_join_thread()
        q.close()


def train_online(cfg: TrainConfig, progress: bool = True, hook: Callable[[dict], None] | None = None) -> dict:
    """Train ``cfg.algo`` online for cfg.steps updates; ``hook(info)`` (tests) gets update, collector_pids,
    replay, successes (the self-imitation ring or None)."""
    if cfg.algo not in ALGOS:
        raise ValueError(f"--online: --algo {cfg.algo!r} is not an actor-critic algorithm ({', '.join(ALGOS)})")
    if not Path(cfg.dataset).exists():
        raise FileNotFoundError(
            f"--online needs --dataset (an episode store for the normaliser); {cfg.dataset} missing"
        )
    store = EpisodeStore.open(cfg.dataset)
    engine = Engine(cfg.engine, cfg.seed)
    try:
        if engine.dist.enabled:
            raise ValueError("--online runs in one process: launch it without torchrun")
        return _train(cfg, store, engine, hook)
    finally:
        shutdown_distributed()


def _train(cfg: TrainConfig, store: EpisodeStore, engine: Engine, hook: Callable[[dict], None] | None) -> dict:
    oc = cfg.online_rl
    out = _prepare_out(cfg, engine)
    algo = build_algo(cfg, store, engine)
    engine.prepare(algo)
    start, summary = restore_algo_state(cfg, out, algo, engine, "update")
    env_id = store.attrs["env_id"]
    env_kwargs = {**env_kwargs_from_store(store), "obs_modes": tuple(cfg.chunk.obs_keys)}
    if oc.max_episode_steps:
        env_kwargs["max_steps"] = oc.max_episode_steps
    ctx = mp.get_context("spawn")
    actor_cpu = _cpu_copy(algo.policy)
    buf = ReplayBuffer(transition_spec(actor_cpu), oc.replay, shared=True)
    # Self-imitation (bc_data "successes"): a uniform ring of successful episodes feeds the actor's BC term.
    good = None
    if oc.bc_data == "successes":
        good = ReplayBuffer(transition_spec(actor_cpu), dataclasses.replace(oc.replay, prioritized=False), shared=True)
    if oc.prefill_from_dataset:
        c = cfg.chunk
        demos = ChunkTransitionDataset(store, c.obs_keys, c.n_obs_steps, c.horizon, c.n_action_steps)
        print(f"online: replay prefilled with {prefill_replay(buf, demos)} chunk transitions of {cfg.dataset}")
        if good is not None:
            won = np.flatnonzero(store.success)
            wins = ChunkTransitionDataset(store, c.obs_keys, c.n_obs_steps, c.horizon, c.n_action_steps, episodes=won)
            print(f"online: {prefill_replay(good, wins)} of them from its {len(won)} successful episodes to imitate")
    board, stop, env_steps = WeightBoard(actor_cpu, ctx), ctx.Event(), ctx.Value("q", 0)
    args = lambda i, seed: (  # noqa: E731
        i, actor_cpu, env_id, env_kwargs, board.handle(), buf.handle(), env_steps, stop,
        oc.exploration_noise, oc.envs_per_collector, cfg.seed * 7919 + seed, good.handle() if good else None,
    )  # fmt: skip
    inbox, outbox, evaluator = ctx.Queue(), ctx.Queue(), None
    old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    log = RunLog(out, start)
    collectors: Collectors | None = None
    step, rng = start, np.random.default_rng(cfg.seed + start)
    snapshot_env_steps: dict[int, int] = {}  # update -> env steps at the snapshot sent to the evaluator

    def save(at: int) -> None:
        save_algo_state(cfg, out, at, algo, engine, summary)

    try:
        collectors = Collectors(ctx, args, oc.n_collectors)
        if oc.eval_every:
            seeds = list(range(cfg.eval_seed, cfg.eval_seed + oc.eval_episodes))
            evaluator = ctx.Process(
                target=evaluator_main, args=(actor_cpu, env_id, env_kwargs, seeds, inbox, outbox, stop), daemon=True
            )
            evaluator.start()
        t0 = time.perf_counter()
        while step < cfg.steps and not (oc.env_steps and env_steps.value >= oc.env_steps):
            for ev in collectors.restart_dead():
                log.write({"step": step, **ev})
            if hook is not None:
                hook({"update": step, "collector_pids": collectors.pids, "replay": buf, "successes": good})
            buf.sync()
            if len(buf) < oc.learning_starts:
                time.sleep(0.05)
                continue
            progress = step / cfg.steps
            idx, flat, weights = buf.sample(cfg.batch_size, rng, progress=min(1.0, progress))
            batch = engine.to_device({**_tensors(nest(flat)), "weights": torch.from_numpy(weights)})
            batch["progress"] = progress
            if good is not None:  # the BC term's own batch of successful episodes (None until the first)
                good.sync()
                bc = nest(good.sample(cfg.batch_size, rng)[1]) if len(good) else None
                batch["bc"] = engine.to_device({**_tensors(bc), "progress": progress}) if bc is not None else None
            logs = algo.update(batch)
            td_error = logs.pop("td_error")  # (B,) |TD| per sampled slot from the critic step: its new priority
            buf.update_priorities(idx, td_error)
            logs["td_error"] = float(td_error.mean())
            step += 1
            if step % oc.publish_every == 0:
                board.publish(_cpu_copy(algo.policy))
            if oc.eval_every and step % oc.eval_every == 0:
                inbox.put((step, flat_weights(_cpu_copy(algo.policy))))
                snapshot_env_steps[step] = env_steps.value
            while not outbox.empty():
                rec = outbox.get()  # the env steps collected when its snapshot was taken: learning curves' x axis
                log.write({"step": step, "eval_env_steps": snapshot_env_steps.pop(rec["update"], None), **rec})
            if step % 10 == 0 or step == cfg.steps:
                dt = time.perf_counter() - t0
                rec = {"step": step, **logs, "env_steps": env_steps.value, "replay_size": len(buf),
                       "updates_per_s": (step - start) / dt, "env_steps_per_s": env_steps.value / dt,
                       **({"successes_size": len(good)} if good is not None else {})}  # fmt: skip
                log.write(rec)
                summary = rec
            if cfg.engine.save_every and step % cfg.engine.save_every == 0 and step < cfg.steps:
                save(step)
    except KeyboardInterrupt:
        stop_children([*(collectors.procs if collectors else []), *([evaluator] if evaluator else [])], stop)
        if step > start:
            save(step)
        raise
    finally:
        stop_children([*(collectors.procs if collectors else []), *([evaluator] if evaluator else [])], stop)
        close_queues(inbox, outbox)
        signal.signal(signal.SIGTERM, old_term)
        log.close()
        board.close()
        for ring in (buf, good):
            if ring is not None:
                ring.close()
                ring.unlink()
    save(step)
    meta = {"env_id": env_id, "env_kwargs": env_kwargs_from_store(store), "dataset": str(cfg.dataset),
            "algo": cfg.algo, "online": True, "train_steps": step, "env_steps": env_steps.value,
            "collector_restarts": collectors.restarts}  # fmt: skip
    summary = {**summary, **meta}
    save_policy(out / "checkpoint", algo.policy, meta)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _cpu_copy(policy: Any) -> Any:
    import copy

    return copy.deepcopy(policy).cpu().eval()


def _tensors(d: dict) -> dict:
    return {k: _tensors(v) if isinstance(v, dict) else torch.from_numpy(np.asarray(v)) for k, v in d.items()}
