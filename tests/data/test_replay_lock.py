"""ProcessLock and the shared replay ring's journal: a process SIGKILLed while it holds the lock, or half way through
writing its items, neither hangs the others nor leaves a torn item in the ring."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import threading
import time

import numpy as np
import pytest

from dmrl.data.replay import ProcessLock, ReplayBuffer, ReplayConfig

SPEC = {"obs": ((2, 3), np.float32), "action": ((4, 2), np.float32)}
CTX = mp.get_context("spawn")


def _items(ids) -> dict[str, np.ndarray]:
    """Items whose every field encodes the item id (obs = id, action = -id), so a torn row shows."""
    ids = np.asarray(ids, np.float32)
    return {
        "obs": np.broadcast_to(ids[:, None, None], (len(ids), 2, 3)).copy(),
        "action": np.broadcast_to(-ids[:, None, None], (len(ids), 4, 2)).copy(),
    }


def _hold(lock, ready) -> None:
    """Child: take the lock, say so, and sleep holding it until killed."""
    lock.acquire()
    ready.send(os.getpid())
    time.sleep(120)


def _add_and_die(handle, ids) -> None:
    """Child: add items to the ring, SIGKILLed once the first key's rows are in their slots (the others not)."""
    buf = ReplayBuffer.attach(handle)

    def dying_put(first, rows):
        key = next(iter(rows))
        m, pos = len(rows[key]), first % buf.capacity
        buf._arrays[key][pos : pos + m] = rows[key]  # the ring does not wrap inside this write (the test's layout)
        os.kill(os.getpid(), signal.SIGKILL)

    buf._put = dying_put
    buf.add(_items(ids))
    time.sleep(120)  # not reached


@pytest.mark.parametrize("holder", ["lock", "replay"])
def test_lock_of_a_sigkilled_holder_is_free_within_a_second(holder):
    buf = ReplayBuffer(SPEC, ReplayConfig(capacity=8, prioritized=False), shared=True) if holder == "replay" else None
    lock = buf.handle().lock if buf is not None else ProcessLock()
    mine, theirs = CTX.Pipe()
    proc = CTX.Process(target=_hold, args=(lock, theirs), daemon=True)
    proc.start()
    try:
        assert mine.poll(60), "the child never took the lock"
        assert mine.recv() == proc.pid
        assert not lock.acquire(block=False) and not lock.acquire(timeout=0.1)  # held by the child
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        assert lock.acquire(timeout=1.0), "the lock of a SIGKILLed holder was not released"
        assert time.monotonic() - t0 < 1.0
        lock.release()
        if buf is not None:  # the ring is usable again: a write and a save take the same lock
            buf.add(_items(range(3)))
            assert buf.sync() == 3 and buf.state_dict()["__count__"] == 3
    finally:
        proc.kill()
        proc.join(10)
        if buf is not None:
            buf.close()
            buf.unlink()
        else:
            lock.close()


def test_writer_killed_half_way_through_an_add_leaves_whole_items():
    with ReplayBuffer(SPEC, ReplayConfig(capacity=8, prioritized=False), shared=True) as buf:
        buf.add(_items(range(8)))  # full: the child's items overwrite slots 0-2
        assert buf.sync() == 8
        proc = CTX.Process(target=_add_and_die, args=(buf.handle(), [8, 9, 10]), daemon=True)
        proc.start()
        proc.join(60)
        assert proc.exitcode == -signal.SIGKILL
        assert buf.n_written == 8  # its items are not counted yet: the journal is
        rows = buf._arrays
        assert rows["obs"][0, 0, 0] == 8 and rows["action"][0, 0, 0] == 0  # slot 0 torn by the child
        assert buf.sync() == 3 and buf.n_written == 11  # the next holder of the lock finished the write
        state = buf.state_dict()
        ids = state["obs"][:, 0, 0]
        np.testing.assert_array_equal(ids, [8, 9, 10, 3, 4, 5, 6, 7])
        np.testing.assert_array_equal(state["action"], -state["obs"][:, :1, :1].repeat(4, 1).repeat(2, 2))


def test_copies_exclude_each_other_and_threads_are_ordered():
    lock = ProcessLock()
    try:
        copy = pickle.loads(pickle.dumps(lock))  # what another process gets: the same file, opened anew
        assert not copy.owner and copy.path == lock.path
        with lock:
            assert not copy.acquire(block=False)
            assert not lock.acquire(timeout=0.05)  # not reentrant: another thread of this process waits too
        assert copy.acquire(block=False)
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=5)))
        waiter.start()
        time.sleep(0.1)
        assert not got  # waiting on the copy's holder
        copy.release()
        waiter.join(5)
        assert got == [True]
        lock.release()
        with pytest.raises(RuntimeError, match="does not hold"):
            lock.release()
        copy.close()
    finally:
        lock.close()
    assert not os.path.exists(lock.path)  # the owner's close removes the file
    with pytest.raises(FileNotFoundError, match="lock file is gone") as err:
        pickle.loads(pickle.dumps(lock))
    assert "\n" not in str(err.value)
    with pytest.raises(RuntimeError, match="is closed"):
        lock.acquire()
