"""Replay ring with uniform or proportional prioritized sampling (PER, Schaul et al. 2016), optionally in shared
memory so spawned collector processes write transitions straight into it.

Who does what with `shared=True`:

  trainer (owner)     ReplayBuffer(spec, config, shared=True); passes buf.handle() to collectors; calls
                      buf.sync() before sampling, then sample() / update_priorities() after each critic step.
  collector (spawned) buf = ReplayBuffer.attach(handle); buf.add(batch) ... buf.close().

The data and one int64 counter (items ever written) live in shared memory; every write takes the handle's lock,
writes the rows, then bumps the counter. The lock is a ProcessLock (flock): a writer SIGKILLed inside add() frees
it, and the ring still holds whole items only, as a shared ring's writes go through a journal: rows are staged,
marked as the items [first, end) to write, copied into their slots and counted; whoever takes the lock next and
finds a marked range not counted redoes the copy (see `_commit`). The sum tree stays in the owner only: `sync()`
reads the counter and gives the current max priority to every slot written since the previous sync, so
collectors never touch it.
Sampling does not take the lock, so a row a collector is overwriting at that moment can come back half old and
half new; like other asynchronous replay designs we accept that (the ring is large and overwrites are rare).
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

import numpy as np

from dmrl.data.replay.config import ReplayConfig, ReplayHandle, Spec, check_spec
from dmrl.data.replay.lock import ProcessLock
from dmrl.data.replay.shared import SegmentGroup
from dmrl.data.replay.sumtree import SumTree

_COUNT = "__count__"  # reserved block name for the counters: items written, the journal's first and end item
_STAGE = "__stage__."  # reserved prefix of the journal's blocks (shared rings)
_STAGE_ROWS = 1024  # items per journal entry: a longer add() is written in several


class ReplayBuffer:
    """A ring of `capacity` items, each a dict of fixed-shape arrays given by `spec` (key -> (shape, dtype)),
    e.g. obs (To, S) float32, action (Tp, Da) float32, reward (Ta,) float32, done (Ta,) bool, next_obs (To, S).

    Slot of the i-th item ever written: i % capacity. Only the newest `capacity` items are kept.
    """

    def __init__(
        self,
        spec: dict[str, tuple[tuple[int, ...], Any]],
        config: ReplayConfig | None = None,
        shared: bool = False,
        lock: Any = None,
    ) -> None:
        """shared=True puts the arrays in shared memory (see `handle`); `lock` defaults to a ProcessLock when
        shared (a threading.Lock otherwise)."""
        config = config if config is not None else ReplayConfig()
        self._setup(check_spec(spec), config, shared, lock, blocks=None)

    def _setup(self, spec: Spec, config: ReplayConfig, shared: bool, lock: Any, blocks: dict[str, str] | None) -> None:
        self.spec = spec
        self.config = config
        self.capacity = config.capacity
        self.shared = shared
        self._owner = blocks is None
        layout = [(k, (self.capacity, *shape), dtype) for k, (shape, dtype) in spec.items()]
        layout.append((_COUNT, (3,), np.dtype(np.int64)))
        segments: SegmentGroup | None = None
        self._own_lock = lock is None and blocks is None
        if shared:
            rows = min(self.capacity, _STAGE_ROWS)
            layout += [(_STAGE + k, (rows, *shape), dtype) for k, (shape, dtype) in spec.items()]
            segments = SegmentGroup.create(layout) if blocks is None else SegmentGroup.attach(layout, blocks)
            arrays = {k: a.array for k, a in segments.arrays.items()}
            self._lock = lock if lock is not None else ProcessLock()
        else:
            arrays = {k: np.zeros(shape, dtype) for k, shape, dtype in layout}
            self._lock = lock if lock is not None else threading.Lock()
        # Views before the segments that back them: if this object is collected, its views go first.
        self._count: np.ndarray | None = arrays.pop(_COUNT)  # (3,) int64: items ever written, journal first, end
        self._stage = {k: arrays.pop(_STAGE + k) for k in spec} if shared else None
        self._arrays: dict[str, np.ndarray] = arrays  # key -> (capacity, *shape)
        self._segments = segments
        # The sum tree (and so prioritized sampling) exists only in the owner; an attached copy only writes.
        self._tree = SumTree(self.capacity) if config.prioritized and self._owner else None
        self._synced = 0  # counter value at the last sync(): slots up to here have a priority
        self._sample_calls = 0

    # --- shared memory -------------------------------------------------------------------------------------

    def handle(self) -> ReplayHandle:
        """A picklable description for `attach` in another process (pass it as a Process argument)."""
        if self._segments is None:
            raise RuntimeError("ReplayBuffer.handle() needs shared memory; construct it with shared=True")
        spec = {k: (shape, dtype.str) for k, (shape, dtype) in self.spec.items()}
        return ReplayHandle(spec=spec, config=self.config, blocks=self._segments.names(), lock=self._lock)

    @classmethod
    def attach(cls, handle: ReplayHandle) -> ReplayBuffer:
        """Map the owner's shared ring in this process; the result can `add` (and sample uniformly)."""
        buf = cls.__new__(cls)
        buf._setup(check_spec(handle.spec), handle.config, True, handle.lock, blocks=handle.blocks)
        return buf

    def close(self) -> None:
        """Unmap the shared arrays in this process (idempotent); the buffer is unusable afterwards."""
        self._arrays, self._count, self._stage = {}, None, None
        if self._segments is not None:
            self._segments.close()

    def unlink(self) -> None:
        """Owner only: free the shared memory system-wide (also done at exit or GC if forgotten)."""
        if not self._owner:
            raise RuntimeError("ReplayBuffer.unlink() is for the process that created the buffer; call close()")
        if self._segments is not None:
            self._segments.unlink()
        if self._own_lock and isinstance(self._lock, ProcessLock):
            self._lock.close()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
        if self._owner:
            self.unlink()

    # --- counters ------------------------------------------------------------------------------------------

    def _counter(self) -> np.ndarray:
        if self._count is None:
            raise RuntimeError("ReplayBuffer is closed; create or attach a new one")
        return self._count

    @property
    def n_written(self) -> int:
        """Items ever written, by any process (monotone)."""
        return int(self._counter()[0])

    @property
    def pos(self) -> int:
        """Slot the next item goes to."""
        return self.n_written % self.capacity

    def __len__(self) -> int:
        """Items held: min(n_written, capacity)."""
        return min(self.n_written, self.capacity)

    # --- writing -------------------------------------------------------------------------------------------

    def add(self, batch: dict[str, np.ndarray]) -> None:
        """Append N items: batch[k] (N, *spec[k].shape) for every spec key, N >= 0 the same for all keys.

        Wraps around the ring; if N > capacity only the last `capacity` rows are stored. In the owner of a
        prioritized buffer the new items get the current max priority at once (via `sync`).
        """
        count = self._counter()
        missing = [k for k in self.spec if k not in batch]
        if missing:
            raise ValueError(
                f"ReplayBuffer.add: missing key {missing[0]!r}; batch needs every spec key: {list(self.spec)}"
            )
        extra = [k for k in batch if k not in self.spec]
        if extra:
            raise ValueError(f"ReplayBuffer.add: unknown key {extra[0]!r}; spec keys are {list(self.spec)}")
        values = {k: np.asarray(batch[k]) for k in self.spec}
        lead = values[next(iter(self.spec))]
        n = lead.shape[0] if lead.ndim else -1  # -1 makes a 0-d value fail the shape check below
        for k, (shape, dtype) in self.spec.items():
            v = values[k]
            if v.shape != (n, *shape):
                raise ValueError(
                    f"ReplayBuffer.add[{k!r}]: got shape {v.shape}; must be (N, *{shape}), same N for all keys"
                )
            if not np.can_cast(v.dtype, dtype, "same_kind"):
                raise ValueError(f"ReplayBuffer.add[{k!r}]: got dtype {v.dtype}; must cast to {dtype} (same kind)")
        if n > 0:
            skip = max(n - self.capacity, 0)  # rows that this very call would overwrite again
            with self._lock:
                self._redo()
                first = int(count[0]) + skip
                if self._stage is None:  # a process-local ring: no other process sees a write cut short
                    self._put(first, {k: v[skip:] for k, v in values.items()})
                    count[0] = first + n - skip  # last, so a reader that sees the new count also sees the rows
                else:
                    rows = len(next(iter(self._stage.values())))  # min(capacity, _STAGE_ROWS) >= n - skip pieces
                    for lo in range(skip, n, rows):
                        self._commit(first + lo - skip, {k: v[lo : lo + rows] for k, v in values.items()})
        if self._tree is not None:
            self.sync()

    def _put(self, first: int, rows: dict[str, np.ndarray]) -> None:
        """Write items first, first+1, ... (rows: key -> (m, *shape), m <= capacity) into their slots."""
        m = len(next(iter(rows.values())))
        pos = first % self.capacity
        head = min(m, self.capacity - pos)  # rows before the ring wraps
        for k, arr in self._arrays.items():
            arr[pos : pos + head] = rows[k][:head]
            arr[: m - head] = rows[k][head:]

    def _commit(self, first: int, rows: dict[str, np.ndarray]) -> None:
        """Under the lock, a shared ring: items first, first+1, ... through the journal. The rows are staged, then
        [first, end) marked (first before end: a mark is whole once end moved), then copied and counted. A writer
        killed before the mark leaves the ring untouched; after it, `_redo` finishes its copy."""
        assert self._stage is not None and self._count is not None
        m = len(next(iter(rows.values())))
        for k, st in self._stage.items():
            st[:m] = rows[k]
        self._count[1] = first
        self._count[2] = first + m
        self._redo()

    def _redo(self) -> None:
        """Under the lock: copy a journal entry not yet counted (its writer died, or is `_commit`) into the ring."""
        count = self._counter()
        first, end = int(count[1]), int(count[2])
        if self._stage is not None and end > count[0]:
            self._put(first, {k: st[: end - first] for k, st in self._stage.items()})
            count[0] = end  # last, so a reader that sees the new count also sees the rows

    def sync(self) -> int:
        """Owner: give the current max priority to every slot written since the last sync (by any process).
        Returns the number of items written since then (can exceed capacity)."""
        with self._lock:
            self._redo()  # a writer that died after its journal mark: its items count
            n = int(self._counter()[0])
        new = n - self._synced
        if new > 0 and self._tree is not None:
            slots = np.arange(max(self._synced, n - self.capacity), n, dtype=np.int64) % self.capacity
            self._tree.update(slots, self._tree.max_value)
        self._synced = n
        return new

    # --- saving ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Owner: a copy of the filled slots {key: (size, *shape)} plus ``__count__`` (items ever written),
        ``__priorities__`` (size,) (prioritized: p_i^alpha per slot, the max for slots not yet synced) and
        ``__max_priority__``. The rows and the counter are copied under the lock, so writers never tear them."""
        if not self._owner:
            raise RuntimeError("ReplayBuffer.state_dict() is for the process that created the buffer")
        with self._lock:
            self._redo()
            n = int(self._counter()[0])
            size = min(n, self.capacity)
            out = {k: arr[:size].copy() for k, arr in self._arrays.items()}
        out[_COUNT] = np.asarray(n, np.int64)
        if self._tree is not None:
            p = self._tree.get(np.arange(size, dtype=np.int64))
            p[p == 0] = self._tree.max_value  # written after the last sync(): the priority sync() would give
            out["__priorities__"], out["__max_priority__"] = p, np.asarray(self._tree.max_value)
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Owner: put a `state_dict` back (same spec and capacity); slots, counter and priorities as saved."""
        if not self._owner:
            raise RuntimeError("ReplayBuffer.load_state_dict() is for the process that created the buffer")
        n = int(state[_COUNT])
        size = min(n, self.capacity)
        for k, (shape, dtype) in self.spec.items():
            v = state.get(k)
            if v is None or v.shape != (size, *shape) or v.dtype != dtype:
                got = "missing" if v is None else f"{v.dtype} {v.shape}"
                raise ValueError(f"replay state[{k!r}]: {got}; this ring needs {dtype} {(size, *shape)}")
        with self._lock:
            for k, arr in self._arrays.items():
                arr[:size] = state[k]
            self._counter()[:] = n  # and no journal entry pending
        self._synced = n
        if self._tree is not None and size:
            p = state.get("__priorities__")
            if p is None or p.shape != (size,):  # saved by a uniform ring: every item at the max, as if new
                p = np.full(size, self._tree.max_value)
            self._tree.update(np.arange(size, dtype=np.int64), p)
            if "__max_priority__" in state:
                self._tree._max = max(self._tree._max, float(state["__max_priority__"]))

    # --- sampling ------------------------------------------------------------------------------------------

    def beta(self, progress: float | None = None) -> float:
        """Importance exponent: beta0 + (1 - beta0) * min(1, progress), progress defaulting to
        (sampling calls so far) / beta_steps."""
        if progress is None:
            progress = self._sample_calls / self.config.beta_steps
        elif not 0 <= progress <= 1:
            raise ValueError(f"sample progress: got {progress}; must be in [0, 1] (e.g. step / total_steps)")
        return self.config.beta0 + (1.0 - self.config.beta0) * min(1.0, progress)

    def sample(
        self, batch_size: int, rng: np.random.Generator, progress: float | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """Draw B = batch_size items (with replacement): `sample_indices` then `gather`.

        Returns indices (B,) int64 slots (give them back to `update_priorities`), batch {k: (B, *shape)} copies,
        and importance weights (B,) float32 (see `sample_indices`).
        """
        indices, weights = self.sample_indices(batch_size, rng, progress)
        return indices, self.gather(indices), weights

    def sample_indices(
        self, batch_size: int, rng: np.random.Generator, progress: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw B slots without reading the data: indices (B,) int64 and importance weights (B,) float32.

        Uniform: weights all ones. Prioritized: stratified, [0, total) is cut into B equal segments with one
        uniform draw in each, so P(i) = p_i^alpha / sum_k p_k^alpha over the N synced items, and
        w_i = (N P(i))^-beta / max_j w_j (Schaul et al. 2016, Alg. 1). Each call advances beta's schedule.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise ValueError(f"sample batch_size: got {batch_size!r}; must be an int >= 1")
        self._counter()
        if self.config.prioritized:
            if self._tree is None:
                raise RuntimeError("prioritized sample() needs the sum tree, which only the creating process has")
            total = self._tree.total
            if not total > 0:
                raise ValueError("ReplayBuffer.sample: no synced items; add() (or sync() after collectors wrote)")
            u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
            indices = self._tree.find(u)
            probs = self._tree.get(indices) / total  # P(i), > 0: find never returns an empty slot
            # (N P_i)^-beta / max_j (N P_j)^-beta == (P_i / min_j P_j)^-beta: N cancels, and no overflow when
            # N P_i is tiny.
            weights = (probs / probs.min()) ** -self.beta(progress)
        else:
            size = len(self)
            if size == 0:
                raise ValueError("ReplayBuffer.sample: buffer is empty; add() items first")
            self.beta(progress)  # validates progress the same way in both modes
            indices = rng.integers(0, size, batch_size, dtype=np.int64)
            weights = np.ones(batch_size)
        self._sample_calls += 1
        return indices, weights.astype(np.float32)

    def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Rows of slots: indices (B,) int -> {k: (B, *spec[k].shape)} copies (safe to keep after overwrites)."""
        self._counter()
        return {k: arr[indices] for k, arr in self._arrays.items()}

    def priorities(self, indices: np.ndarray) -> np.ndarray:
        """Stored sampling mass p_i^alpha of slots: indices (B,) int -> (B,) float64 (0 for never-synced slots)."""
        if self._tree is None:
            raise RuntimeError("priorities() needs the sum tree: a prioritized buffer, in the process that made it")
        return self._tree.get(indices)

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Set p_i = (|td_i| + eps)^alpha for sampled slots: indices (B,) int64 from `sample`, td_errors (B,)
        (e.g. the chunk TD error per item, as numpy). A no-op for a uniform buffer, so callers need not branch.

        A slot overwritten since it was sampled gets the old item's priority; PER implementations accept this.
        """
        if not self.config.prioritized:
            return
        if self._tree is None:
            raise RuntimeError("update_priorities() needs the sum tree, which only the creating process has")
        indices = np.asarray(indices)
        td = np.asarray(td_errors, dtype=np.float64)
        if td.shape != indices.shape or td.ndim != 1:
            raise ValueError(f"update_priorities td_errors: got shape {td.shape}; must be (B,) = {indices.shape}")
        if not np.all(np.isfinite(td)):
            raise ValueError("update_priorities td_errors: got NaN or inf; check the critic loss before updating")
        self._tree.update(indices, (np.abs(td) + self.config.eps) ** self.config.alpha)
