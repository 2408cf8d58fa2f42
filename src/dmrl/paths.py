"""Output paths checked before any work starts, and a full disk told apart from other write errors (no dmrl imports).

Every command that writes (``--out`` of collect, train, eval, export) calls :func:`check_output_path` first, so a
path under a file, in a read-only directory or with an impossible name fails in one line with nothing created,
instead of a traceback after minutes of work.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: errno values that mean "no room left": the disk (ENOSPC) or the user's quota (EDQUOT).
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
#: How libraries that do not raise OSError report a full disk (safetensors: Rust's StorageFull / os error 28;
#: torch.save: the C library's strerror).
_FULL_TEXT = ("No space left on device", "StorageFull", "os error 28", "Disk quota exceeded")


def check_output_path(path: str | Path, flag: str = "--out", *, directory: bool = True) -> None:
    """Raise a one-line ValueError unless ``path`` can be written: an existing writable directory (``directory``)
    or file, or a new one whose nearest existing ancestor is a writable directory. Creates nothing.

    ``flag`` names the option in the message; ``directory=False`` for a file output (the file and the directory
    it sits in must both be writable, since writers put temp files and side files next to it).
    """
    p = Path(path)

    def fail(why: str) -> None:
        raise ValueError(f"{flag} {p}: {why}; choose another {flag}")

    if os.path.lexists(p):
        if directory and not p.is_dir():
            fail("is a file, not a directory" if p.is_file() else "is not a directory")
        if not directory and p.is_dir():
            fail("is a directory, not a file")
        if not os.access(p, os.W_OK | (os.X_OK if directory else 0)):
            fail("is not writable")
        if directory:
            return
    missing: list[str] = []
    anc = p.parent
    while not os.path.lexists(anc) and anc != anc.parent:
        missing.append(anc.name)
        anc = anc.parent
    which = "parent" if anc == p.parent else "ancestor"
    if not anc.is_dir():
        fail(f"its {which} {anc} is a file" if anc.is_file() else f"its {which} {anc} is not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        fail(f"its {which} {anc} is not writable")
    try:
        name_max = os.pathconf(anc, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or no limit reported
        name_max = 255
    for name in (*missing, p.name):
        if len(os.fsencode(name)) > name_max:
            fail(f"the name {name[:20]}... is longer than {name_max} bytes, so it cannot be created")


def is_disk_full(e: BaseException) -> bool:
    """True when ``e`` (or an exception it was raised from) says the disk or the user's quota is full."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _FULL:
            return True
        if any(t in str(cur) for t in _FULL_TEXT):
            return True
        cur = cur.__cause__ or cur.__context__
    return False
