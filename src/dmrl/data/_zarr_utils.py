"""Small zarr helpers for the episode store: one-line errors, chunk sizing, resize-then-write appends."""

from __future__ import annotations

import asyncio
import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.core.sync import sync

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; a second writer is not detected there
    fcntl = None  # type: ignore[assignment]

CORRUPT_HINT = "not a dmrl episode store, or corrupt; re-run dmrl collect"
# A few hundred frames per image chunk keeps chunks at a few MB: big enough for zstd and sequential reads,
# small enough that rewriting the open chunk on every append stays cheap.
_IMAGE_CHUNK_BYTES = 4 << 20
_IMAGE_CHUNK_ROWS = (16, 256)
_LOWDIM_STEP_ROWS = 8192
_LOWDIM_EPISODE_ROWS = 1024


class StoreError(ValueError):
    """A path that is not a readable dmrl episode store, or lacks what was asked of it (one-line message)."""


class StoreExistsError(StoreError, FileExistsError):
    """`EpisodeStore.create` on a path that already exists (without overwrite, or not a store)."""


class StoreLockedError(StoreError):
    """Another process holds the store's writer lock (one-line message naming the store and its pid)."""


#: The writer lock: a file inside the store, ``fcntl.flock``-ed for a whole write session. The OS drops the lock
#: when the holder closes it or dies (SIGKILL included), so a crash never leaves a store locked.
LOCK_FILE = ".dmrl-writer.lock"
#: Locks this process holds: lock file path -> [fd, holders]. Writers in one process share the lock (flock would
#: refuse a second open of the file even in the same process); it keeps out other processes.
_HELD: dict[str, list[int]] = {}


def lock_writer(path: Path) -> Callable[[], None]:
    """Take the writer lock of the store at ``path`` (an existing directory); returns the function releasing it.

    Raises StoreLockedError when another process holds it, StoreError when the lock file cannot be created.
    """
    if fcntl is None:
        return lambda: None
    key = os.path.realpath(path / LOCK_FILE)
    entry = _HELD.get(key)
    if entry is not None and not os.path.exists(key):  # the store was deleted and made anew while held here
        entry = None
    if entry is None:
        try:
            fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StoreError(f"dmrl store {path}: cannot open its writer lock ({e.strerror}); is it writable?") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreError(f"dmrl store {path}: cannot lock it for writing ({e.strerror})") from e
            who = f"pid {holder}" if holder.isdigit() else "another process"
            raise StoreLockedError(
                f"dmrl store {path}: locked by {who}, which is writing to it; "
                "wait for that writer to finish, or write to another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        entry = _HELD[key] = [fd, 0]
    entry[1] += 1
    done = False

    def release() -> None:
        nonlocal done
        if done:
            return
        done = True
        entry[1] -= 1
        if entry[1] == 0:
            if _HELD.get(key) is entry:
                del _HELD[key]
            os.close(entry[0])  # closing the descriptor drops the flock

    return release


def step_chunks(shape: tuple[int, ...], dtype: str) -> tuple[int, ...]:
    """Chunk shape for a per-step array whose rows have `shape`."""
    if len(shape) >= 2:  # images: chunk by bytes, clamped to a few hundred frames
        row_bytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        rows = int(np.clip(_IMAGE_CHUNK_BYTES // row_bytes, *_IMAGE_CHUNK_ROWS))
    else:
        rows = _LOWDIM_STEP_ROWS
    return (rows, *shape)


def episode_chunks(shape: tuple[int, ...], dtype: str) -> tuple[int, ...]:
    """Chunk shape for a per-episode array (one row per episode)."""
    if len(shape) >= 2:
        row_bytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        return (int(np.clip(_IMAGE_CHUNK_BYTES // row_bytes, 1, 64)), *shape)
    return (_LOWDIM_EPISODE_ROWS, *shape)


def write_rows(arr: zarr.Array, start: int, rows: np.ndarray) -> None:
    """Set rows [start, start+len(rows)) of `arr`, resizing it to end exactly there first.

    Resizing to an absolute size (not appending to the current one) makes a retried write after an
    interrupted one land in the same place.
    """
    end = start + len(rows)
    if arr.shape[0] != end:
        arr.resize((end, *arr.shape[1:]))
    if len(rows):
        arr[start:end] = rows


async def _write_rows_async(arr: zarr.Array, start: int, rows: np.ndarray) -> None:
    a = arr.async_array
    end = start + len(rows)
    if a.shape[0] != end:
        await a.resize((end, *a.shape[1:]))
    if len(rows):
        await a.setitem(slice(start, end), rows)


def write_batch(writes: list[tuple[zarr.Array, int, np.ndarray]]) -> None:
    """`write_rows` for many arrays at once, concurrently on zarr's event loop; returns when all are done.

    One round trip instead of two per array makes an append ~5x faster. Every write is awaited (even
    when one fails) so no straggler can land after the caller moves on to the commit or a retry.
    """

    async def run() -> list[BaseException | None]:
        return await asyncio.gather(*(_write_rows_async(*w) for w in writes), return_exceptions=True)

    for result in sync(run()):
        if isinstance(result, BaseException):
            raise result


def read_root_attrs(path: Path) -> dict[str, Any]:
    """Check `path` is a zarr v3 group by reading its zarr.json ourselves, so errors name the file."""
    if not path.exists():
        raise StoreError(f"dmrl store {path}: path does not exist; create it with dmrl collect --out {path}")
    meta = path / "zarr.json"
    if not path.is_dir() or not meta.is_file():
        raise StoreError(f"dmrl store {path}: missing 'zarr.json' ({CORRUPT_HINT})")
    try:
        doc = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StoreError(f"dmrl store {path}: corrupt 'zarr.json' ({type(e).__name__}; {CORRUPT_HINT})") from e
    if not isinstance(doc, dict) or doc.get("zarr_format") != 3 or doc.get("node_type") != "group":
        raise StoreError(f"dmrl store {path}: 'zarr.json' is not a zarr v3 group ({CORRUPT_HINT})")
    attrs = doc.get("attributes", {})
    return attrs if isinstance(attrs, dict) else {}


def require_array(path: Path, root: zarr.Group, key: str) -> zarr.Array:
    """`root[key]` as an array, or a one-line StoreError naming the path and the missing/corrupt key."""
    try:
        node = root[key]
    except KeyError:
        raise StoreError(f"dmrl store {path}: missing array '{key}' ({CORRUPT_HINT})") from None
    except Exception as e:  # zarr surfaces bad metadata as JSONDecodeError, ValueError, TypeError, ...
        raise StoreError(f"dmrl store {path}: corrupt metadata for '{key}' ({type(e).__name__}; {CORRUPT_HINT})") from e
    if not isinstance(node, zarr.Array):
        raise StoreError(f"dmrl store {path}: '{key}' is a group, expected an array ({CORRUPT_HINT})")
    return node


def clear_partial_files(path: Path) -> None:
    """Delete temp files a killed zarr write left behind (LocalStore writes `<name>.<uuid>.partial`)."""
    for p in path.rglob("*.partial"):
        p.unlink(missing_ok=True)
