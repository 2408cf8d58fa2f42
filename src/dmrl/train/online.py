"""The online data source of actor-critic training (Ape-X, Horgan et al. 2018): collector processes fill a shared
replay ring with chunk transitions of the newest published actor; the training loop samples it (PER) and updates.

--dataset supplies the normaliser statistics and shapes (and --init the starting weights). Ctrl-C / SIGTERM: the
stop flag ends every child, the state so far is saved, and the run can --resume. Every training state holds the
replay rings as they were when it was saved (replay.npz, successes.npz, online.json), so a resumed run, after a
SIGKILL too, starts from the replay of its state. A collector or the evaluator that dies is restarted; children
die with a SIGKILLed learner (dmrl.train.online_workers). While they run, ``<out>/children.json`` names them
({"learner": pid, "collectors": [pids], "evaluator": pid or null}; rewritten atomically whenever one starts) for
tools that watch or fault-inject a run; it is removed once they are stopped, so a file left behind belongs to a
learner that was killed: check that its "learner" pid is the one you started.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing as mp
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmrl.data import ChunkTransitionDataset, EpisodeStore
from dmrl.data.replay import ReplayBuffer
from dmrl.train.config import OnlineConfig, TrainConfig
from dmrl.train.engine import Engine
from dmrl.train.offline import env_kwargs_from_store
from dmrl.train.online_workers import (
    Pace,
    StepCounter,
    StopFlag,
    WeightBoard,
    collector_main,
    evaluator_main,
    flat_weights,
    nest,
    prefill_replay,
    transition_spec,
    write_children,
)

log = logging.getLogger(__name__)

# Under --source.env-steps-per-update the learner waits only when the collectors are this many env steps behind:
# they add whole episodes (up to a few hundred steps), so an exact ratio would stall the learner at every episode.
PACE_SLACK = 500


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM takes Ctrl-C's path: children stopped, state saved


def _dead(p: Any) -> bool:
    """Whether child ``p`` has exited. ``is_alive()`` alone is not enough: when something else in this process
    reaps children (a library calling waitpid(-1)), waitpid on the pid fails with ECHILD and multiprocessing keeps
    reporting the child alive forever; /proc tells the truth (gone, or a zombie not yet reaped)."""
    if not p.is_alive():
        return True
    try:
        state = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return Path("/proc/self").exists()  # gone (reaped elsewhere); without /proc (not Linux) trust is_alive
    return state in ("Z", "X")


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
            if _dead(p):
                self.restarts += 1
                seed = 1000 * self.restarts + i
                log.warning("online: collector %d (pid %s) died with exit code %s; restarting", i, p.pid, p.exitcode)
                self.procs[i] = self._start(i, seed)
                events.append({"collector_restart": i, "exitcode": p.exitcode})
        return events


class Evaluator:
    """The evaluator process: started, restarted when it died (with new queues: a process killed inside get() or
    put() can leave a queue's lock held or half a message in its pipe), stopped."""

    def __init__(self, ctx: Any, args: Callable[[Any, Any], tuple]) -> None:
        self.ctx, self.args, self.restarts = ctx, args, 0
        self.proc, self.inbox, self.outbox = self._start()

    def _start(self) -> tuple[Any, Any, Any]:
        inbox, outbox = self.ctx.Queue(), self.ctx.Queue()
        p = self.ctx.Process(target=evaluator_main, args=self.args(inbox, outbox), daemon=True, name="evaluator")
        p.start()
        return p, inbox, outbox

    def restart_dead(self) -> list[dict[str, Any]]:
        """Restart the evaluator if it died (snapshots sent to it and not scored are lost); -> event records."""
        if not _dead(self.proc):
            return []
        dead = self.proc
        self.restarts += 1
        log.warning("online: evaluator (pid %s) died with exit code %s; restarting", dead.pid, dead.exitcode)
        close_queues(self.inbox, self.outbox)
        self.proc, self.inbox, self.outbox = self._start()
        return [{"evaluator_restart": self.restarts, "exitcode": dead.exitcode}]


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


class OnlineSource:
    """Batches sampled from a replay ring that collector processes fill with the newest actor's chunk transitions.

    Until the ring holds learning_starts items ``next_batch`` returns None (the loop waits). After each update the
    sampled items get their new |TD| priorities and every publish_every updates the collectors get the actor.
    """

    log_every = 10

    def __init__(self, cfg: TrainConfig, store: EpisodeStore, engine: Engine, hook: Callable[[dict], None] | None):
        self.cfg, self.store, self.engine, self.hook = cfg, store, engine, hook
        self.oc: OnlineConfig = cfg.source
        self.env_id = store.attrs["env_id"]
        self.env_kwargs = {**env_kwargs_from_store(store), "obs_modes": tuple(cfg.chunk.obs_keys)}
        if self.oc.max_episode_steps:
            self.env_kwargs["max_steps"] = self.oc.max_episode_steps
        self.ctx = mp.get_context("spawn")
        self.collectors: Collectors | None = None
        self.evaluator: Evaluator | None = None
        self.buf: Any = None
        self.demos: Any = None  # the dataset's ring when offline_share > 0 (process-local, rebuilt on resume)
        self.good: Any = None
        self.board: Any = None
        self.old_term: Any = None
        self.snapshot_env_steps: dict[int, int] = {}  # update -> env steps at the snapshot sent to the evaluator
        self.idx: Any = None
        self.pace: Any = None  # the collectors' gate under env_steps_per_update
        self.pace_origin: tuple[int, int] | None = None  # (update, env steps) when learning started
        self.stop: Any = None
        self.env_steps: Any = None
        self.resume_dir: Path | None = None
        self.pending: list[dict] = []  # records for the next events() call (replay_restored)
        self.halted = self.closed = False
        self.ray = False  # whether start() started Ray (the ray backend), so close() shuts it down

    def restore(self, state_dir: Path) -> None:
        """--resume: start() fills the rings from this training state's replay files (when it has them)."""
        self.resume_dir = Path(state_dir)

    def start(self, algo: Any, start_step: int) -> None:
        """Replay rings (prefilled from --dataset if asked), weight board, collectors and evaluator processes."""
        cfg, oc, store = self.cfg, self.oc, self.store
        self.rng = np.random.default_rng(cfg.seed + start_step)
        # Collectors and evaluator act as evaluation does: with best-of-N the critic chooses the chunks they run.
        actor_cpu = _cpu_copy(algo.evaluation_policy())
        # An algorithm may explore with another policy of the same weights (dsrl: noise around its actor's).
        collect_cpu = _cpu_copy(algo.collection_policy()) if hasattr(algo, "collection_policy") else actor_cpu
        self.buf = ReplayBuffer(transition_spec(actor_cpu), oc.replay, shared=True)
        self.demos = None
        if oc.offline_share > 0:  # the dataset in a ring of its own, sampled uniformly beside the replay (RLPD)
            c = cfg.chunk
            demos = ChunkTransitionDataset(store, c.obs_keys, c.n_obs_steps, c.horizon, c.n_action_steps)
            ring = dataclasses.replace(oc.replay, capacity=max(len(demos), 1), prioritized=False)
            self.demos = ReplayBuffer(transition_spec(actor_cpu), ring, shared=False)
            log.info("online: %d dataset chunk transitions, %.0f%% of each batch", prefill_replay(self.demos, demos),
                     100 * oc.offline_share)  # fmt: skip
        # Self-imitation (bc_data "successes"): a uniform ring of successful episodes feeds the actor's BC term.
        if oc.bc_data == "successes":
            uniform = dataclasses.replace(oc.replay, prioritized=False)
            self.good = ReplayBuffer(transition_spec(actor_cpu), uniform, shared=True)
        restored = self._load_replay() if self.resume_dir is not None else None
        if oc.prefill_from_dataset and restored is None:
            c = cfg.chunk
            demos = ChunkTransitionDataset(store, c.obs_keys, c.n_obs_steps, c.horizon, c.n_action_steps)
            log.info("online: replay prefilled with %d chunk transitions of %s", prefill_replay(self.buf, demos),
                     cfg.dataset)  # fmt: skip
            if self.good is not None:
                won = np.flatnonzero(store.success)
                wins = ChunkTransitionDataset(
                    store, c.obs_keys, c.n_obs_steps, c.horizon, c.n_action_steps, episodes=won
                )
                log.info("online: %d of them from its %d successful episodes to imitate",
                         prefill_replay(self.good, wins), len(won))  # fmt: skip
        ctx = self.ctx
        env_steps = self.env_steps0 = int(restored["env_steps"]) if restored else 0
        if oc.backend == "ray":  # collectors and evaluator as Ray actors (dmrl.train.ray_workers)
            from dmrl.train.ray_workers import start_ray

            rings = (self.buf, self.good)
            self.ray, self.board, self.env_steps, self.collectors, self.evaluator = start_ray(
                cfg, actor_cpu, self.env_id, self.env_kwargs, rings, env_steps, collect_cpu
            )
            self.old_term = signal.signal(signal.SIGTERM, _on_sigterm)  # after ray.init, which may set its own
            return
        self.board, self.stop, self.env_steps = WeightBoard(actor_cpu, ctx), StopFlag(ctx), StepCounter(ctx, env_steps)
        self.pace = Pace(ctx) if oc.env_steps_per_update else None
        good = self.good
        args = lambda i, seed: (  # noqa: E731
            i, collect_cpu, self.env_id, self.env_kwargs, self.board.handle(), self.buf.handle(), self.env_steps,
            self.stop, oc.exploration_noise, oc.envs_per_collector, cfg.seed * 7919 + seed,
            good.handle() if good else None, self.pace.allowed if self.pace else None,
        )  # fmt: skip
        self.old_term = signal.signal(signal.SIGTERM, _on_sigterm)
        self.collectors = Collectors(ctx, args, oc.n_collectors)
        if oc.eval_every:
            seeds = list(range(cfg.eval_seed, cfg.eval_seed + oc.eval_episodes))
            eval_args = lambda inbox, outbox: (  # noqa: E731
                actor_cpu, self.env_id, self.env_kwargs, seeds, inbox, outbox, self.stop,
            )  # fmt: skip
            self.evaluator = Evaluator(ctx, eval_args)
        self._write_children()

    def _write_children(self) -> None:
        """<out>/children.json: the pids of the children now (see the module doc)."""
        assert self.collectors is not None
        if self.oc.backend == "ray":  # actors have no pids of this learner's children
            return
        ev = self.evaluator.proc.pid if self.evaluator is not None else None
        try:
            write_children(Path(self.cfg.out) / "children.json", self.collectors.pids, ev)
        except OSError as e:  # a file for outside tools: the run goes on without it
            log.warning("online: cannot write %s/children.json (%s)", self.cfg.out, e.strerror)

    # --- the replay in training states --------------------------------------------------------------------

    def write_state(self, state_dir: Path) -> None:
        """Into a training state being written: the rings' slots, counters and priorities (replay.npz, and
        successes.npz for self-imitation) and online.json (env steps, ring sizes). Collectors keep running: each
        ring is copied under its lock, so the copy holds whole items only."""
        sizes: dict[str, int] = {"env_steps": int(self.env_steps.value)}
        for name, ring in (("replay", self.buf), ("successes", self.good)):
            if ring is None:
                continue
            state = ring.state_dict()
            with open(Path(state_dir) / f"{name}.npz", "wb") as f:  # a file object: a full disk keeps its errno
                np.savez(f, **state)
            sizes[f"{name}_size"] = min(int(state["__count__"]), ring.capacity)
            sizes[f"{name}_written"] = int(state["__count__"])
        (Path(state_dir) / "online.json").write_text(json.dumps(sizes))

    def _load_replay(self) -> dict[str, int] | None:
        """The resume state's rings put back (None if it has none: a state of a dmrl before replay saving)."""
        assert self.resume_dir is not None
        meta_path = self.resume_dir / "online.json"
        if not meta_path.is_file():
            log.warning("online: %s holds no replay; the replay ring starts empty", self.resume_dir)
            return None
        try:
            meta = json.loads(meta_path.read_text())
            for name, ring in (("replay", self.buf), ("successes", self.good)):
                if ring is not None:
                    with np.load(self.resume_dir / f"{name}.npz") as z:
                        ring.load_state_dict({k: z[k] for k in z.files})
        except (OSError, ValueError, KeyError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(
                f"training state {self.resume_dir}: its replay is unreadable ({msg}); "
                "delete that directory to resume from the one before"
            ) from None
        record = {"replay_restored": len(self.buf), "replay_written": self.buf.n_written,
                  "env_steps_restored": int(meta.get("env_steps", 0))}  # fmt: skip
        if self.good is not None:
            record["successes_restored"] = len(self.good)
        log.info("online: replay restored from %s: %d items", self.resume_dir.name, len(self.buf))
        self.pending.append(record)
        return meta

    def exhausted(self) -> bool:
        return bool(self.oc.env_steps and self.env_steps.value >= self.oc.env_steps)

    def events(self, step: int) -> list[dict]:
        """Collector restarts, and evaluations that finished (with the env steps collected at their snapshot)."""
        restarts = self.collectors.restart_dead()
        ev = self.evaluator
        if ev is not None:
            restarts += ev.restart_dead()
        if restarts:
            self._write_children()
        records, self.pending = [*self.pending, *restarts], []
        if ev is not None:
            while not ev.outbox.empty():
                rec = ev.outbox.get()  # the env steps collected when its snapshot was taken: learning curves' x axis
                records.append({"eval_env_steps": self.snapshot_env_steps.pop(rec["update"], None), **rec})
        if self.hook is not None:
            self.hook({"update": step, "collector_pids": self.collectors.pids, "replay": self.buf,
                       "collectors": self.collectors, "successes": self.good,
                       "evaluator_pid": ev.proc.pid if ev else None})  # fmt: skip
        return records

    def next_batch(self, step: int) -> dict | None:
        self.buf.sync()
        if len(self.buf) < self.oc.learning_starts:
            time.sleep(0.05)
            return None
        if self.oc.env_steps_per_update and self._behind(step):
            time.sleep(0.005)
            return None
        progress = step / self.cfg.steps
        n_off = self.oc.offline_items(self.cfg.batch_size) if self.demos is not None else 0
        self.idx, flat, weights = self.buf.sample(self.cfg.batch_size - n_off, self.rng, progress=min(1.0, progress))
        flat, weights = self._with_demos(flat, n_off), np.concatenate([np.ones(n_off, np.float32), weights])
        batch = self.engine.to_device({**_tensors(nest(flat)), "weights": torch.from_numpy(weights)})
        batch["progress"] = progress
        if self.oc.replay.prioritized:
            # The actor learns from a uniform draw: PER's high-|TD| items are what the critic needs, not a
            # distribution the actor should fit or maximise Q over (actor-critic methods need uniform samples).
            uniform = self.buf.gather(self.rng.integers(0, len(self.buf), self.cfg.batch_size - n_off))
            uniform = self._with_demos(uniform, n_off)
            batch["actor"] = self.engine.to_device({**_tensors(nest(uniform)), "progress": progress})
        if self.good is not None:  # the BC term's own batch of successful episodes (None until the first)
            self.good.sync()
            bc = nest(self.good.sample(self.cfg.batch_size, self.rng)[1]) if len(self.good) else None
            batch["bc"] = self.engine.to_device({**_tensors(bc), "progress": progress}) if bc is not None else None
        return batch

    def _behind(self, step: int) -> bool:
        """Replay ratio: whether the collectors are more than PACE_SLACK env steps short of
        env_steps_per_update x the updates since learning started (the learner then waits for them). The first
        call fixes that origin (update, env steps)."""
        if self.pace_origin is None:
            self.pace_origin = (step, self.env_steps.value)
            if self.pace is not None:
                self.pace.allow(self.pace_origin[1])  # collectors wait for the first update
        s0, e0 = self.pace_origin
        return self.env_steps.value - e0 + PACE_SLACK < self.oc.env_steps_per_update * (step - s0)

    def _with_demos(self, flat: dict, n: int) -> dict:
        """``n`` uniform dataset items put in front of a replay draw (their PER weight is 1: not prioritized)."""
        if n == 0:
            return flat
        demo = self.demos.gather(self.rng.integers(0, len(self.demos), n))
        return {k: np.concatenate([demo[k], flat[k]]) for k in flat}

    def after_update(self, step: int, logs: dict, algo: Any) -> None:
        """New priorities (|TD| per sampled slot), the acting policy (the actor, with its critic when it ranks
        best-of-N) published to collectors and evaluator."""
        self.buf.update_priorities(self.idx, logs["td_error"][len(logs["td_error"]) - len(self.idx) :])
        if self.pace is not None:  # collectors may run this far ahead of the updates done
            s0, e0 = self.pace_origin
            self.pace.allow(e0 + int(self.oc.env_steps_per_update * (step - s0)))
        publish = step % self.oc.publish_every == 0
        snapshot = self.evaluator is not None and step % self.oc.eval_every == 0
        if not (publish or snapshot):
            return
        acting = _cpu_copy(algo.evaluation_policy())  # one copy serves collectors and evaluator
        if publish:
            self.board.publish(acting)
        if snapshot:
            self.evaluator.inbox.put((step, flat_weights(acting)))
            self.snapshot_env_steps[step] = self.env_steps.value

    def rates(self, steps: int, seconds: float) -> dict[str, float]:
        return {"env_steps": self.env_steps.value, "replay_size": len(self.buf), "updates_per_s": steps / seconds,
                "env_steps_per_s": (self.env_steps.value - self.env_steps0) / seconds,
                **({"successes_size": len(self.good)} if self.good is not None else {})}  # fmt: skip

    def validation(self, step: int, algo: Any) -> dict[str, float]:
        return {}

    def curve(self, step: int, algo: Any) -> None:
        return None

    def eval_env_kwargs(self) -> dict[str, Any]:
        """The collectors' env (episode length included), observations chosen by the evaluator."""
        return {k: v for k, v in self.env_kwargs.items() if k != "obs_modes"}

    def meta(self) -> dict[str, Any]:
        restarts = self.collectors.restarts if self.collectors is not None else 0
        return {"online": True, "env_steps": self.env_steps.value, "collector_restarts": restarts,
                "evaluator_restarts": self.evaluator.restarts if self.evaluator is not None else 0}  # fmt: skip

    def halt(self) -> None:
        """Stop every child and close the queues; the rings stay readable (write_state) until close()."""
        if self.halted:
            return
        self.halted = True
        ev = self.evaluator
        if self.oc.backend == "ray":  # actors killed; the rings are the learner's own
            for actors in (self.collectors, ev):
                if actors is not None:
                    actors.stop()
        elif self.stop is not None:
            procs = [*(self.collectors.procs if self.collectors else []), *([ev.proc] if ev else [])]
            stop_children(procs, self.stop)
            (Path(self.cfg.out) / "children.json").unlink(missing_ok=True)
            if ev is not None:
                close_queues(ev.inbox, ev.outbox)
        if self.old_term is not None:
            signal.signal(signal.SIGTERM, self.old_term)

    def close(self) -> None:
        """Stop every child, close the queues and free the shared rings (idempotent; safe after a failed start)."""
        if self.closed:
            return
        self.closed = True
        self.halt()
        if self.board is not None:
            self.board.close()
        if self.env_steps is not None:
            self.env_steps.close()
        for ring in (self.buf, self.good):
            if ring is not None:
                ring.close()
                ring.unlink()
        if self.demos is not None:
            self.demos.close()
        if self.ray:
            import ray

            ray.shutdown()


def _cpu_copy(policy: Any) -> Any:
    import copy

    return copy.deepcopy(policy).cpu().eval()


def _tensors(d: dict) -> dict:
    return {k: _tensors(v) if isinstance(v, dict) else torch.from_numpy(np.asarray(v)) for k, v in d.items()}
