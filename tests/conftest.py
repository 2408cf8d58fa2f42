"""Suite-wide guards: no test may leave child processes behind, and the pytest process must exit promptly.

CI gives the whole run a hard limit; a process that hangs at interpreter exit (a queue feeder thread, a child
never joined) would otherwise eat all of it silently after every test has passed."""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import sys

import pytest

EXIT_GRACE_S = 180


@pytest.fixture(autouse=True)
def _no_leaked_children():
    yield
    left = mp.active_children()  # also reaps finished children
    for p in left:
        p.kill()
        p.join(5)
    assert not left, f"test left child processes running: {[p.name for p in left]}"


def pytest_unconfigure(config):
    # Past this point only interpreter shutdown remains: if it stalls, print every thread's stack and exit 1.
    faulthandler.dump_traceback_later(EXIT_GRACE_S, exit=True, file=sys.stderr)
