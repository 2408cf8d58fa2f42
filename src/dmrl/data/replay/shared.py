"""Numpy arrays backed by POSIX shared memory, for a replay ring that spawned collector processes write into.

One `SharedMemory` block per array. The creating process owns the blocks: it unlinks them on `unlink()`, and a
`weakref.finalize` (which also runs at interpreter exit) unlinks them if the owner forgets, so /dev/shm does not
fill up with dead rings. Other processes `attach` by name and only ever close their mapping.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterable
from multiprocessing import shared_memory

import numpy as np


class SharedArray:
    """A numpy array of fixed (shape, dtype) living in one shared-memory block.

    The array is a view of the block: it must be dropped before the mapping closes, which `close()` does
    (numpy holds a buffer export on the block, and closing under an export raises BufferError).
    """

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, name: str | None = None) -> None:
        """Create a zero-filled block (name=None) or attach to the existing block `name`."""
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)  # a block cannot have size 0
        if name is None:
            shm = shared_memory.SharedMemory(create=True, size=nbytes)
        else:
            # Python >= 3.13 can skip the resource tracker for an attach; before that an attach registers too,
            # which is harmless for processes started by multiprocessing (they share the owner's tracker).
            extra = {"track": False} if sys.version_info >= (3, 13) else {}
            shm = shared_memory.SharedMemory(name=name, create=False, **extra)
            if shm.size < nbytes:
                shm.close()
                raise ValueError(f"shared block {name}: has {shm.size} bytes; {shape} {dtype} needs {nbytes}")
        self.array: np.ndarray | None = np.ndarray(shape, dtype=dtype, buffer=shm.buf)
        self.shm = shm  # set after `array` so that, if this object is collected, the view dies first
        self.owner = name is None

    @property
    def name(self) -> str:
        return self.shm.name

    def close(self) -> None:
        """Drop the array view and unmap the block (idempotent). The data survive until `unlink`."""
        self.array = None
        # If someone still holds a view of the array, the mapping goes when they drop it.
        with contextlib.suppress(BufferError):
            self.shm.close()


def _unlink_all(shms: list[shared_memory.SharedMemory]) -> None:
    for shm in shms:
        with contextlib.suppress(FileNotFoundError):  # already unlinked (by the owner, or by hand)
            shm.unlink()


class SegmentGroup:
    """The shared arrays of one buffer, closed together; the owner's group also unlinks them together."""

    def __init__(self, arrays: dict[str, SharedArray]) -> None:
        self.arrays = arrays
        shms = [a.shm for a in arrays.values()]
        self.owner = all(a.owner for a in arrays.values())
        # The finalizer must not reference `self`; it holds the SharedMemory objects (not the numpy views),
        # and only unlinks: unmapping at exit is the OS's job, and closing under live views would fail.
        self._finalizer = weakref.finalize(self, _unlink_all, shms) if self.owner else None

    def names(self) -> dict[str, str]:
        """Array key -> shared block name (what `attach` needs)."""
        return {k: a.name for k, a in self.arrays.items()}

    def close(self) -> None:
        for a in self.arrays.values():
            a.close()

    def unlink(self) -> None:
        """Remove the blocks from the system (owner only); processes that still map them keep their view."""
        if self._finalizer is None:
            raise RuntimeError("unlink() is for the process that created the buffer; attached copies only close()")
        self._finalizer()  # runs _unlink_all once, then the finalizer is dead

    @classmethod
    def create(cls, specs: Iterable[tuple[str, tuple[int, ...], np.dtype]]) -> SegmentGroup:
        created: dict[str, SharedArray] = {}
        try:
            for key, shape, dtype in specs:
                created[key] = SharedArray(shape, dtype)
        except BaseException:  # e.g. /dev/shm full half way: do not leak the blocks already made
            for a in created.values():
                a.close()
            _unlink_all([a.shm for a in created.values()])
            raise
        return cls(created)

    @classmethod
    def attach(cls, specs: Iterable[tuple[str, tuple[int, ...], np.dtype]], names: dict[str, str]) -> SegmentGroup:
        attached: dict[str, SharedArray] = {}
        try:
            for key, shape, dtype in specs:
                attached[key] = SharedArray(shape, dtype, name=names[key])
        except BaseException:
            for a in attached.values():
                a.close()
            raise
        return cls(attached)
