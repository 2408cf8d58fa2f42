"""Online training's collectors and evaluator as Ray actors (Ape-X on a Ray cluster, Horgan et al. 2018;
Moritz et al. 2018): the learner puts the acting policy's state in Ray's object store, each collector pulls the
newest one before an episode and sends back its chunk transitions, a batch per call, which the learner adds to its
own replay ring (the same ReplayBuffer as the process backend's).

Calls, not loops: the learner keeps ``inflight`` collect() calls queued on every collector actor (so an actor never
waits for the learner) and takes in the finished ones each time the run loop asks for events. A call names the
collector's seed, so a restarted actor (Ray re-runs its constructor) starts a fresh seed, as a restarted collector
process does, and one collector with the same seed collects what the process backend's collector does.

Faults: actors are made with ``max_restarts`` and Ray re-runs the calls a dead actor had queued on its new
incarnation; the first result of a new incarnation is logged as a ``collector_restart`` (or ``evaluator_restart``)
event, the collector gets a fresh seed, and batches of calls it re-ran with the old seed are dropped. An actor Ray
gave up on (restarts used up, or its node gone for good: ActorDiedError) is replaced by a new one, also logged.
Ray is imported here only, so the process backend never needs it.
"""

from __future__ import annotations

import logging
import os
import queue
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dmrl.policies.base import ChunkPolicy
from dmrl.train.online_workers import float_keys, load_flat, rollout_chunks

log = logging.getLogger(__name__)

MAX_RESTARTS = 3  # Ray restarts of one actor before the learner replaces it with a new one
INFLIGHT = 2  # collect() calls queued per collector actor


def import_ray() -> Any:
    """The ray module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ValueError("--source.backend ray needs Ray: pip install 'dmrl[ray]' (or pip install ray)") from None
    return ray


def init_ray(address: str, n_actors: int) -> bool:
    """Connect to the Ray cluster at ``address`` (``auto``: the one `ray start` made here), or start a small local
    one when ``address`` is empty; nothing when Ray is already initialised. -> whether this call started Ray."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    if address:
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(
                f"--source.ray-address {address}: cannot connect ({msg}); start one with ray start --head"
            ) from None
    else:  # one CPU per actor even on a smaller machine: actors reserve a CPU each (see _actor_options)
        ray.init(
            num_cpus=max(os.cpu_count() or 1, n_actors),
            object_store_memory=512 * 2**20,
            _node_ip_address="127.0.0.1",  # its processes talk over loopback (Ray's servers still bind all interfaces)
            **quiet,
        )
    return True


def state_arrays(policy: ChunkPolicy) -> dict[str, np.ndarray]:
    """The acting policy's floating state_dict as numpy (what travels through the object store: numpy arrays are
    read zero-copy from shared memory by actors on the same node)."""
    sd = policy.state_dict()
    return {k: sd[k].detach().float().cpu().numpy() for k in float_keys(policy)}


def load_arrays(policy: ChunkPolicy, state: dict[str, np.ndarray]) -> None:
    """Inverse of :func:`state_arrays`."""
    sd = policy.state_dict()
    with torch.no_grad():
        for k, v in state.items():
            sd[k].copy_(torch.from_numpy(np.array(v)).view_as(sd[k]))


class CollectorActor:
    """One collector (a Ray actor): episodes of the newest weights as chunk transitions, in batches."""

    def __init__(self, policy: ChunkPolicy, env_id: str, env_kwargs: dict, noise: float, n_envs: int) -> None:
        from dmrl.envs import make_env

        torch.set_num_threads(1)
        self.policy, self.noise = policy.eval(), noise
        self.envs = [make_env(env_id, **env_kwargs) for _ in range(n_envs)]
        self.seed, self.seen, self.instance = None, -1, uuid.uuid4().hex

    def collect(self, seed: int, version: int, board: list) -> dict[str, Any]:
        """One episode per env with the weights of ``version`` (board: [object ref of state_arrays], pulled only
        when the version moved). -> {"items": [stacked transitions {k: (n, ...)} per episode], "won": [bool],
        "env_steps": int, "seed": seed, "pid": int, "instance": this incarnation's id, "restarted": bool}.
        A new ``seed`` restarts the collector's episode count and random streams, as a fresh collector process
        starts them."""
        import ray

        if seed != self.seed:
            self.seed, self.episode, self.rng = seed, 0, np.random.default_rng(seed)
            torch.manual_seed(seed)
        if version != self.seen:
            load_arrays(self.policy, ray.get(board[0]))
            self.seen = version
        out: dict[str, Any] = {"items": [], "won": [], "env_steps": 0, "seed": seed}
        out |= {"pid": os.getpid(), "instance": self.instance, "restarted": _restarted()}
        for env in self.envs:
            s, e = self.seed, self.episode
            items, won = rollout_chunks(self.policy, env, s * 100_003 + e, s * 1000 + e, self.noise, self.rng)
            self.episode += 1
            out["items"].append({k: np.stack([it[k] for it in items]) for k in items[0]})
            out["won"].append(won)
            out["env_steps"] += int(sum(it["valid"].sum() for it in items))
        return out


class EvaluatorActor:
    """The evaluator (a Ray actor): a snapshot's success rate on fixed seeds (as the evaluator process)."""

    def __init__(self, policy: ChunkPolicy, env_id: str, env_kwargs: dict, seeds: list[int]) -> None:
        from dmrl.envs import make_env

        torch.set_num_threads(1)
        self.policy, self.seeds, self.env = policy.eval(), seeds, make_env(env_id, **env_kwargs)
        self.instance = uuid.uuid4().hex

    def evaluate(self, update: int, flat: list) -> dict[str, Any]:
        """flat: [object ref of the snapshot's flat weights (P,)] -> the evaluator process's record, and
        "instance" (this incarnation's id)."""
        import ray

        from dmrl.train.metrics import wilson_interval

        load_flat(self.policy, ray.get(flat[0]))
        torch.manual_seed(0)
        wins = sum(rollout_chunks(self.policy, self.env, s, 0, 0.0, np.random.default_rng(0))[1] for s in self.seeds)
        lo, hi = wilson_interval(wins, len(self.seeds))
        n = len(self.seeds)
        rec = {"update": update, "eval_success": wins / n, "eval_ci_low": lo, "eval_ci_high": hi, "eval_episodes": n}
        return rec | {"instance": self.instance, "restarted": _restarted()}


def _restarted() -> bool:
    """In an actor: whether Ray restarted it (this incarnation is not the first)."""
    import ray

    return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def _give_up_after(replaced: int, who: str, err: Exception) -> None:
    """Raise once MAX_RESTARTS replacements in a row died without a result: an actor that cannot start (its
    constructor fails: a missing package or env on a node) would otherwise be replaced forever."""
    if replaced >= MAX_RESTARTS:
        lines = [line for line in str(err).splitlines() if line.strip()]  # the last names the cause
        msg = lines[-1][:300] if lines else type(err).__name__
        raise RuntimeError(f"online: {who} died {replaced + 1} times in a row without a result; last: {msg}")


def _actor_options() -> dict[str, Any]:
    # One CPU each, so a cluster spreads them over its nodes; Ray restarts a dead actor and re-runs the calls it
    # had queued on the new incarnation.
    return {"num_cpus": 1, "max_restarts": MAX_RESTARTS, "max_task_retries": -1}


class RayBoard:
    """Published weights: the newest state_arrays in the object store and their version (the WeightBoard's role)."""

    def __init__(self, policy: ChunkPolicy) -> None:
        self.version, self.ref = 0, None
        self.publish(policy)

    def publish(self, policy: ChunkPolicy) -> None:
        import ray

        self.ref, self.version = ray.put(state_arrays(policy)), self.version + 1  # the old ref is freed once unused

    def close(self) -> None:
        self.ref = None


class Counter:
    """Env steps collected (the learner counts what it took in; the StepCounter's surface)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def add(self, n: int) -> None:
        self.value += n

    def close(self) -> None:
        pass


@dataclass
class _Slot:
    actor: Any
    seed: int
    instance: str | None = None  # the actor's incarnation (from its constructor): a new one means Ray restarted it
    pid: int | None = None
    replaced: int = 0  # actors made for this collector since its last batch


class RayCollectors:
    """The collector actors: calls queued, results added to the learner's rings, restarts logged."""

    def __init__(self, args: tuple, n: int, seed0: int, board: RayBoard, rings: tuple, steps: Counter) -> None:
        ray = import_ray()
        self.cls = ray.remote(**_actor_options())(CollectorActor)
        self.args, self.seed0, self.board, self.steps, self.restarts = args, seed0, board, steps, 0
        self.buf, self.good = rings
        self.slots = [_Slot(self.cls.remote(*args), seed0 + i) for i in range(n)]
        self.pending: dict[Any, tuple[int, Any]] = {}  # object ref of a queued call -> (collector index, actor)
        self.intake_s, self.batches = 0.0, 0  # learner time spent taking batches in (wait, get, add), batches taken
        for i in range(n):
            for _ in range(INFLIGHT):
                self._submit(i)

    def _submit(self, i: int) -> None:
        s = self.slots[i]
        self.pending[s.actor.collect.remote(s.seed, self.board.version, [self.board.ref])] = (i, s.actor)

    @property
    def actors(self) -> list[Any]:
        return [s.actor for s in self.slots]

    @property
    def pids(self) -> list[int | None]:
        """The collectors' worker pids as last reported (None before an actor's first batch)."""
        return [s.pid for s in self.slots]

    def restart_dead(self) -> list[dict[str, Any]]:
        """Take in every finished batch (into the replay, and the successes ring when it won) and re-queue its
        collector; -> one event record per collector actor that Ray restarted (or that was replaced)."""
        import ray

        events: list[dict[str, Any]] = []
        if not self.pending:
            return events
        t0 = time.perf_counter()
        done, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)
        for ref in done:
            i, actor = self.pending.pop(ref)
            s = self.slots[i]
            try:
                out = ray.get(ref)
            except ray.exceptions.ActorDiedError as e:  # restarts used up, or its node gone: a new actor
                if actor is s.actor:  # the first failed call of that actor
                    _give_up_after(s.replaced, f"collector actor {i}", e)
                    events.append(self._restarted(i, "died for good; replacing it with a new actor"))
                    s.actor, s.instance, s.replaced = self.cls.remote(*self.args), None, s.replaced + 1
                self._submit(i)
                continue
            s.replaced = 0
            if out["instance"] != s.instance and out["restarted"]:  # a new incarnation that Ray restarted
                events.append(self._restarted(i, "was restarted by Ray"))
            s.instance, s.pid = out["instance"], out["pid"]
            if out["seed"] == s.seed:  # else a call queued before the restart, re-run by Ray with the old seed
                for items, won in zip(out["items"], out["won"], strict=True):
                    self.buf.add(items)
                    if won and self.good is not None:
                        self.good.add(items)
                self.steps.add(out["env_steps"])
                self.batches += 1
            self._submit(i)
        self.intake_s += time.perf_counter() - t0
        return events

    def _restarted(self, i: int, what: str) -> dict[str, Any]:
        s = self.slots[i]
        self.restarts += 1
        s.seed = self.seed0 + 1000 * self.restarts + i  # a fresh seed, as a restarted collector process gets
        log.warning("online: collector actor %d (pid %s) %s", i, s.pid, what)
        return {"collector_restart": i}  # no exit code: Ray reports none

    def stop(self) -> None:
        """Kill every actor (queued calls are dropped)."""
        import ray

        for s in self.slots:
            ray.kill(s.actor, no_restart=True)
        self.pending.clear()


class _Snapshots:
    """The evaluator's inbox: put((update, flat weights)) keeps the newest snapshot not yet scored."""

    def __init__(self, owner: RayEvaluator) -> None:
        self.owner = owner

    def put(self, item: tuple[int, np.ndarray]) -> None:
        self.owner.waiting = item
        self.owner.pump()


@dataclass
class _Proc:
    pid: int | None = None


class RayEvaluator:
    """The evaluator actor behind the Evaluator's surface: inbox.put((update, flat)), outbox (a queue of records),
    restart_dead() -> event records, restarts. One snapshot at a time; a newer snapshot replaces one not started,
    as the evaluator process skips to the newest."""

    def __init__(self, args: tuple) -> None:
        ray = import_ray()
        self.cls = ray.remote(**_actor_options())(EvaluatorActor)
        self.args, self.actor, self.restarts, self.instance = args, self.cls.remote(*args), 0, None
        self.replaced = 0  # actors made since the last evaluation
        self.inbox, self.outbox = _Snapshots(self), queue.Queue()
        self.proc = _Proc()
        self.waiting: tuple[int, np.ndarray] | None = None
        self.running: Any = None

    def pump(self) -> list[dict[str, Any]]:
        """Take in a finished evaluation, start the next one; -> an evaluator_restart record when its actor was
        restarted by Ray (the snapshot it was scoring is re-run) or replaced (that snapshot is lost)."""
        import ray

        events = []
        if self.running is not None and ray.wait([self.running], timeout=0)[0]:
            ref, self.running = self.running, None
            try:
                rec = ray.get(ref)
            except ray.exceptions.ActorDiedError as e:  # restarts used up, or its node gone: a new actor
                _give_up_after(self.replaced, "evaluator actor", e)
                events.append(self._restarted("died for good; replacing it with a new actor"))
                self.actor, self.instance, self.replaced = self.cls.remote(*self.args), None, self.replaced + 1
            else:
                self.replaced = 0
                instance, restarted = rec.pop("instance"), rec.pop("restarted")
                if instance != self.instance and restarted:
                    events.append(self._restarted("was restarted by Ray"))
                self.instance = instance
                self.outbox.put(rec)
        if self.running is None and self.waiting is not None:
            update, flat = self.waiting
            self.waiting, self.running = None, self.actor.evaluate.remote(update, [ray.put(flat)])
        return events

    def _restarted(self, what: str) -> dict[str, Any]:
        self.restarts += 1
        log.warning("online: evaluator actor %s", what)
        return {"evaluator_restart": self.restarts}

    def restart_dead(self) -> list[dict[str, Any]]:
        return self.pump()

    def stop(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)
        self.running = self.waiting = None


def start_ray(
    cfg: Any, actor: ChunkPolicy, env_id: str, env_kwargs: dict, rings: tuple, env_steps: int,
    collect: ChunkPolicy | None = None,
) -> tuple:  # fmt: skip
    """Ray (connected or started), the weight board, collector actors and the evaluator actor (when eval_every)
    of an online run; rings: (replay, successes ring or None); ``collect``: what collectors act with (default:
    ``actor``, the evaluation policy; the same weights). -> (started Ray, board, step counter, collectors,
    evaluator or None)."""
    oc = cfg.source
    ray = import_ray()
    started = init_ray(oc.ray_address, oc.n_collectors + (1 if oc.eval_every else 0))
    board, steps = RayBoard(actor), Counter(env_steps)
    # The actor's weights in the object store once, the ref held here: Ray restarts an actor from its constructor
    # arguments, and a restart fails if they went out of scope.
    actor_ref = ray.put(actor)
    collect_ref = actor_ref if collect is None or collect is actor else ray.put(collect)
    args = (collect_ref, env_id, env_kwargs, oc.exploration_noise, oc.envs_per_collector)
    collectors = RayCollectors(args, oc.n_collectors, cfg.seed * 7919, board, rings, steps)
    evaluator = None
    if oc.eval_every:
        seeds = list(range(cfg.eval_seed, cfg.eval_seed + oc.eval_episodes))
        evaluator = RayEvaluator((actor_ref, env_id, env_kwargs, seeds))
    log.info("online: %d collector actors on Ray (%s)", oc.n_collectors, oc.ray_address or "local")
    return started, board, steps, collectors, evaluator
