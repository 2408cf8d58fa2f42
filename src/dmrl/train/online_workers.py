"""Processes of online training (Ape-X style actors): collectors that roll out the newest published actor into the
shared replay ring as chunk transitions, and an evaluator that scores frozen snapshots on fixed seeds.

Weights travel through one flat float32 shared array (every floating tensor of the actor's state_dict, in
state_dict order) plus a version counter, both written under one lock; a collector copies them in when the
version moved. Transitions are flat dicts {"obs.state": (To, S), "action": (Tp, Da), ...}: the keys and shapes of
a ChunkTransitionDataset item, with nested obs keys joined by a dot so they fit the replay ring's flat spec.

No child can hang the learner by dying: every lock they share is a ProcessLock (the kernel frees it when its
holder dies, where a multiprocessing Lock stays held for good), and the stop signal is a lock-free flag.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing as mp
import os
import queue
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmrl.data.replay import ProcessLock, ReplayBuffer, ReplayHandle
from dmrl.data.replay.shared import SharedArray
from dmrl.policies.base import ChunkPolicy


def float_keys(policy: ChunkPolicy) -> list[str]:
    """The state_dict keys that travel (floating tensors: weights and normaliser statistics)."""
    return [k for k, v in policy.state_dict().items() if v.is_floating_point()]


def flat_weights(policy: ChunkPolicy) -> np.ndarray:
    """The actor's floating state as one (P,) float32 vector."""
    sd = policy.state_dict()
    return torch.cat([sd[k].detach().float().cpu().flatten() for k in float_keys(policy)]).numpy()


def load_flat(policy: ChunkPolicy, flat: np.ndarray) -> None:
    """Inverse of :func:`flat_weights`: copy (P,) into the actor's floating tensors."""
    sd, pos = policy.state_dict(), 0
    with torch.no_grad():
        for k in float_keys(policy):
            n = sd[k].numel()
            sd[k].copy_(torch.from_numpy(np.array(flat[pos : pos + n])).view_as(sd[k]))
            pos += n


class WeightBoard:
    """Trainer side of the published weights: a shared (P,) float32 array, a version counter and their lock."""

    def __init__(self, policy: ChunkPolicy, ctx: Any) -> None:
        flat = flat_weights(policy)
        self.array = SharedArray(flat.shape, np.float32)
        self.version = ctx.Value("q", 0, lock=False)
        self.lock = ProcessLock()
        self.publish(policy)

    def publish(self, policy: ChunkPolicy) -> None:
        with self.lock:
            self.array.array[:] = flat_weights(policy)
            self.version.value += 1

    def handle(self) -> tuple[str, tuple[int, ...], Any, Any]:
        return self.array.name, self.array.array.shape, self.version, self.lock

    def close(self) -> None:
        self.array.close()
        with contextlib.suppress(FileNotFoundError):
            self.array.shm.unlink()
        self.lock.close()


class StopFlag:
    """The learner's stop signal to its children: one shared byte. A multiprocessing Event takes a lock in
    is_set(), which children poll all the time: one killed in there would hang the learner's set()."""

    def __init__(self, ctx: Any) -> None:
        self.flag = ctx.Value("b", 0, lock=False)

    def set(self) -> None:
        self.flag.value = 1

    def is_set(self) -> bool:
        return bool(self.flag.value)


class StepCounter:
    """Env steps collected by all collectors: a shared int64 that they add to under a ProcessLock and the learner
    reads without one (an aligned 8-byte load is never torn, and the count only grows)."""

    def __init__(self, ctx: Any, value: int) -> None:
        self.raw, self.lock = ctx.Value("q", value, lock=False), ProcessLock()

    @property
    def value(self) -> int:
        return int(self.raw.value)

    def add(self, n: int) -> None:
        with self.lock:
            self.raw.value += n

    def close(self) -> None:
        self.lock.close()


class Pace:
    """The replay ratio's gate for collectors: a shared int64 of the env steps they may reach (-1: no limit), which
    the learner raises after every update; a collector finishing an episode past it waits before the next one (so
    the count overshoots by at most one episode per collector)."""

    def __init__(self, ctx: Any) -> None:
        self.allowed = ctx.Value("q", -1, lock=False)

    def allow(self, env_steps: int) -> None:
        self.allowed.value = int(env_steps)


def wait_for_pace(allowed: Any, steps: Any, stop: Any) -> None:
    """Block until the collected env steps are below the learner's allowance (or no limit, or stop, or no
    parent)."""
    while 0 <= allowed.value <= steps.value and not stop.is_set() and not parent_gone():
        time.sleep(0.005)


def write_children(path: Path, collectors: list[int], evaluator: int | None) -> None:
    """``path`` (the run's children.json) := {"learner": this pid, "collectors": [...], "evaluator": pid or null},
    replaced atomically (a reader sees the old file or the new one, never half of one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"learner": os.getpid(), "collectors": collectors, "evaluator": evaluator}))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def transition_spec(policy: ChunkPolicy) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Replay spec of a chunk transition (flat keys), for the lowdim vector observations the actor reads."""
    c = policy.chunk
    to, tp, ta, da = c.n_obs_steps, c.horizon, c.n_action_steps, policy.action_dim
    spec: dict[str, tuple[tuple[int, ...], Any]] = {}
    for k in c.obs_keys:
        spec[f"obs.{k}"] = ((to, int(policy.obs_dims[k])), np.float32)
        spec[f"next_obs.{k}"] = ((to, int(policy.obs_dims[k])), np.float32)
    spec |= {
        "action": ((tp, da), np.float32),
        "action_mask": ((tp,), np.bool_),
        "reward": ((ta,), np.float32),
        "done": ((ta,), np.bool_),
        "valid": ((ta,), np.bool_),
        "next_valid": ((), np.bool_),
        "episode": ((), np.int64),
    }
    return spec


def prefill_replay(buf: ReplayBuffer, dataset: Any, batch_size: int = 1024) -> int:
    """Append every item of a ChunkTransitionDataset to ``buf`` in the collectors' flat layout; -> items added.

    Offline items keep their episode index negated minus one (-1, -2, ...), so they never collide with online
    episode numbers."""
    from torch.utils.data import DataLoader

    n = 0
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        flat = {f"{outer}.{k}": v for outer in ("obs", "next_obs") for k, v in batch.pop(outer).items()}
        flat |= {k: v for k, v in batch.items()}
        flat["episode"] = -1 - flat["episode"]
        buf.add({k: np.asarray(v) for k, v in flat.items()})
        n += len(flat["episode"])
    return n


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{"obs.state": x, "action": a} -> {"obs": {"state": x}, "action": a} (the dataset's nesting)."""
    out: dict[str, Any] = {}
    for k, v in flat.items():
        if "." in k:
            outer, inner = k.split(".", 1)
            out.setdefault(outer, {})[inner] = v
        else:
            out[k] = v
    return out


def rollout_chunks(
    policy: ChunkPolicy, env: Any, seed: int, episode: int, noise: float, rng: np.random.Generator
) -> tuple[list[dict[str, np.ndarray]], bool]:
    """One episode as chunk transitions aligned as ChunkTransitionDataset's (see dmrl.data.transitions).

    Actions not yet known online (the next chunk's, past the Ta executed ones) repeat the last executed action
    with action_mask False, as the dataset pads past an episode's end. Returns (transitions, success).
    """
    c = policy.chunk
    to, tp, ta, keys = c.n_obs_steps, c.horizon, c.n_action_steps, c.obs_keys
    obs, _ = env.reset(seed=seed)
    frames = {k: [np.asarray(obs[k], np.float32)] * to for k in keys}  # fresh history repeats frame 0
    past: list[np.ndarray] = []  # executed actions so far
    out, done, success = [], False, False
    while not done:
        window = {k: np.stack(frames[k][-to:]) for k in keys}  # (To, S)
        with torch.no_grad():
            chunk = policy.predict_chunk({k: torch.from_numpy(v)[None] for k, v in window.items()})[0].numpy()
        t = len(past)
        reward, dn, valid = np.zeros(ta, np.float32), np.zeros(ta, bool), np.zeros(ta, bool)
        for k in range(ta):
            a = np.clip(chunk[to - 1 + k] + noise * rng.standard_normal(chunk.shape[-1]), -1, 1).astype(np.float32)
            obs, r, term, trunc, info = env.step(a)
            past.append(a)
            reward[k], dn[k], valid[k] = r, term, True
            for key in keys:
                frames[key].append(np.asarray(obs[key], np.float32))
            if term or trunc:
                done, success = True, bool(info.get("is_success", False))
                break
        # Action window: steps t-To+1 .. t-To+Tp, edge-padded; only steps already executed are unmasked.
        steps = np.arange(t - to + 1, t - to + 1 + tp)
        mask = (steps >= 0) & (steps < len(past))
        action = np.stack(past)[np.clip(steps, 0, len(past) - 1)]
        # Frames after the episode end clamp to the final observation: the last appended frame.
        nxt = {k: np.stack(frames[k][-to:]) for k in keys}
        item = {f"obs.{k}": v for k, v in window.items()} | {f"next_obs.{k}": v for k, v in nxt.items()}
        item |= dict(action=action, action_mask=mask, reward=reward, done=dn, valid=valid)
        item |= dict(next_valid=np.asarray(bool(valid.all())), episode=np.asarray(episode, np.int64))
        out.append(item)
    return out, success


def _quiet_signals() -> None:
    # Ctrl-C reaches the whole process group: children leave through the stop flag, not a KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()


def _die_with_parent() -> None:
    """A SIGKILLed learner sets no stop flag and runs no cleanup: its children must not outlive it. Linux:
    the kernel sends SIGKILL when the parent dies (PR_SET_PDEATHSIG); :func:`parent_gone` is the portable
    check the loops make too."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if parent_gone():  # died before prctl took effect
        os._exit(1)


def parent_gone() -> bool:
    """Whether the process that started this one has exited (this one was re-parented)."""
    parent = mp.parent_process()
    return parent is not None and os.getppid() != parent.pid


def collector_main(
    index: int,
    policy: ChunkPolicy,
    env_id: str,
    env_kwargs: dict,
    board: tuple,
    replay: ReplayHandle,
    steps: Any,
    stop: Any,
    noise: float,
    n_envs: int,
    seed: int,
    successes: ReplayHandle | None = None,
    allowed: Any = None,
) -> None:
    """Collector process: roll out episodes with the newest weights into the replay ring until ``stop`` is set;
    with a ``successes`` ring, episodes that succeed go into it as well (the self-imitation BC data); with
    ``allowed`` (a Pace's value) an episode starts only while the env steps are below it."""
    _quiet_signals()
    from dmrl.envs import make_env

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    name, shape, version, lock = board
    weights = SharedArray(shape, np.float32, name=name)
    buf = ReplayBuffer.attach(replay)
    good = ReplayBuffer.attach(successes) if successes is not None else None
    envs = [make_env(env_id, **env_kwargs) for _ in range(n_envs)]
    rng, seen, episode = np.random.default_rng(seed), -1, 0
    policy.eval()
    try:
        while not stop.is_set():
            for env in envs:
                if allowed is not None:
                    wait_for_pace(allowed, steps, stop)
                    if stop.is_set() or parent_gone():
                        break
                if version.value != seen:
                    with lock:
                        seen = version.value
                        flat = np.array(weights.array)
                    load_flat(policy, flat)
                items, won = rollout_chunks(policy, env, seed * 100_003 + episode, seed * 1000 + episode, noise, rng)
                episode += 1
                stacked = {k: np.stack([it[k] for it in items]) for k in items[0]}
                buf.add(stacked)
                if won and good is not None:
                    good.add(stacked)
                steps.add(int(sum(it["valid"].sum() for it in items)))
                if stop.is_set() or parent_gone():
                    break
            if parent_gone():
                break
    finally:
        buf.close()
        if good is not None:
            good.close()
        weights.close()
        for env in envs:
            env.close()


def evaluator_main(
    policy: ChunkPolicy, env_id: str, env_kwargs: dict, seeds: list[int], inbox: Any, outbox: Any, stop: Any
) -> None:
    """Evaluator process: for each (update, flat weights) from ``inbox``, run one episode per seed and reply
    {"update", "eval_success", "eval_ci_low", "eval_ci_high", "eval_episodes"}."""
    _quiet_signals()
    from dmrl.envs import make_env
    from dmrl.train.metrics import wilson_interval

    torch.set_num_threads(1)
    env = make_env(env_id, **env_kwargs)
    policy.eval()
    try:
        while not stop.is_set() and not parent_gone():
            try:
                update, flat = inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            try:  # an evaluator slower than eval_every skips to the newest snapshot: the backlog stays bounded
                while True:
                    update, flat = inbox.get_nowait()
            except queue.Empty:
                pass
            load_flat(policy, flat)
            torch.manual_seed(0)
            wins = sum(rollout_chunks(policy, env, s, 0, 0.0, np.random.default_rng(0))[1] for s in seeds)
            lo, hi = wilson_interval(wins, len(seeds))
            outbox.put(
                {
                    "update": update,
                    "eval_success": wins / len(seeds),
                    "eval_ci_low": lo,
                    "eval_ci_high": hi,
                    "eval_episodes": len(seeds),
                }
            )
    finally:
        env.close()
