"""A lock between processes that a dead holder cannot keep: ``fcntl.flock`` on a small lock file.

multiprocessing's Lock is a POSIX semaphore: a holder SIGKILLed inside its critical section never posts it, and
the next acquire in any other process blocks forever (a killed collector would hang the learner). The kernel drops
a flock when the last descriptor of the holder's open file goes away, and a process's death closes its
descriptors, so the lock is free again the moment its holder dies.

flock excludes open files, not processes or threads: every process opens the lock file itself (a pickled lock
carries the path and the copy reopens it, so it travels as a spawn argument, through a queue or a file alike), and
a threading.Lock orders the threads of one process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import threading
import time
import weakref
from multiprocessing import resource_tracker
from types import TracebackType
from typing import Any

# tmpfs on Linux: no disk I/O, flock always supported, and a file there is what a POSIX shared memory object is.
_DIR = "/dev/shm" if sys.platform.startswith("linux") and os.path.isdir("/dev/shm") else None


def _close(fd: int, path: str | None, tracked: str | None) -> None:
    os.close(fd)
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    if tracked is not None:
        resource_tracker.unregister(tracked, "shared_memory")


class ProcessLock:
    """A mutex for processes and their threads, with multiprocessing.Lock's surface: ``with lock:``,
    ``acquire(block=True, timeout=None) -> bool`` and ``release()``; not reentrant.

    The process that makes it owns the lock file: ``close()`` (or garbage collection, or exit) removes it. Copies
    (unpickled in another process) only close their descriptor.
    """

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="dmrl-lock-", dir=_DIR)
        # The resource tracker (which outlives a SIGKILLed owner) removes the file then, as it does the replay's
        # shared memory blocks: on Linux a file in /dev/shm is the POSIX shared memory object of its name.
        tracked = "/" + os.path.basename(path) if _DIR is not None else None
        if tracked is not None:
            resource_tracker.register(tracked, "shared_memory")
        self._setup(path, fd, owner=True, tracked=tracked)

    def _setup(self, path: str, fd: int, owner: bool, tracked: str | None = None) -> None:
        self.path, self.owner = path, owner
        self._fd, self._pid, self._thread = fd, os.getpid(), threading.Lock()
        self._finalizer = weakref.finalize(self, _close, fd, path if owner else None, tracked)
        self._finalizer.atexit = owner

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["path"], self._open(state["path"]), owner=False)

    @staticmethod
    def _open(path: str) -> int:
        try:
            return os.open(path, os.O_RDWR)  # never O_CREAT: a new file would be a different lock
        except FileNotFoundError:
            raise FileNotFoundError(f"ProcessLock {path}: the lock file is gone (its owner closed it)") from None

    def _descriptor(self) -> int:
        if not self._finalizer.alive:
            raise RuntimeError(f"ProcessLock {self.path} is closed")
        if self._pid != os.getpid():  # a forked child shares the parent's open file, so flock would not exclude it
            self._finalizer.detach()
            os.close(self._fd)  # the parent's descriptor (and its lock, if held) stay the parent's
            self._setup(self.path, self._open(self.path), owner=False)
        return self._fd

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; False when ``block`` is False, or ``timeout`` seconds passed, and another holder has it."""
        fd = self._descriptor()
        wait = -1 if timeout is None else max(float(timeout), 0.0)
        deadline = time.monotonic() + wait
        if not (self._thread.acquire(True, wait) if block else self._thread.acquire(False)):
            return False
        try:
            if block and timeout is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
                return True
            delay = 0.0005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if not block or left <= 0:
                        break
                    time.sleep(min(delay, left))  # flock has no timed wait: poll, backing off to 50 ms
                    delay = min(2 * delay, 0.05)
        except BaseException:
            self._thread.release()
            raise
        self._thread.release()
        return False

    def release(self) -> None:
        """Give the lock back (RuntimeError if this process does not hold it)."""
        if not self._thread.locked():
            raise RuntimeError(f"ProcessLock {self.path}: release() of a lock this process does not hold")
        fcntl.flock(self._descriptor(), fcntl.LOCK_UN)
        self._thread.release()

    def __enter__(self) -> ProcessLock:
        self.acquire()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def close(self) -> None:
        """Close this process's descriptor (idempotent); the owner also removes the lock file."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"ProcessLock({self.path!r}{', owner' if self.owner else ''})"
