"""A LeRobot dataset of 14 episodes imports with the same peak memory as one of 4: the import streams a file of
episodes at a time. Measured as the growth of the process's peak resident memory from the 4-episode import to the
14-episode one (the decoded frames grow by 98 MB). An address-space cap (RLIMIT_AS) measured reservations instead
(thread stacks, malloc arenas, zarr's concurrent chunk buffers) and failed at random on CI machines; the absolute
growth over a warmed-up process is ~90-125 MB of codec and zarr buffers whatever the dataset's size."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from fixtures import write_lerobot_v3

from dmrl.data import EpisodeStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")

SLACK = 24 << 20  # bytes the peak may grow between the two imports (measured: 1-4 MB)
HW, EPISODE = (128, 128), 200
FRAME = HW[0] * HW[1] * 3

CHILD = textwrap.dedent(
    """
    import resource, sys
    from pathlib import Path
    from dmrl.data.importers.cli import ImportConfig, run_import

    def peak():  # bytes; Linux reports KiB, the peak over the process's life
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    small, big, out = sys.argv[1:4]
    run_import(ImportConfig(source=Path(small), out=Path(out + ".small")), progress=False)
    before = peak()
    steps = run_import(ImportConfig(source=Path(big), out=Path(out)), progress=False)["steps"]
    print("steps", steps, "grew", peak() - before)
    """
)


def test_import_memory_does_not_grow_with_the_dataset(tmp_path):
    small_n, big_n = 4, 14
    assert (big_n - small_n) * EPISODE * FRAME > 3 * SLACK
    big, small, out = tmp_path / "big", tmp_path / "small", tmp_path / "out.zarr"
    for path, n in ((big, big_n), (small, small_n)):
        cams = ("observation.images.top",)
        write_lerobot_v3(
            path, lengths=(EPISODE,) * n, hw=HW, episodes_per_file=4, cams=cams, vcodec="libx264", keep_frames=False
        )
    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}  # fewer arenas, less noise in the peak
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(small), str(big), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    words = proc.stdout.split()
    assert words[-4:-2] == ["steps", str(big_n * EPISODE)]
    assert words[-2] == "grew" and int(words[-1]) < SLACK, f"the peak resident memory grew {words[-1]} bytes"
    store = EpisodeStore.open(out)
    assert store.n_episodes == big_n and store.obs_spec["rgb"] == ((3, *HW), "uint8")
    last = np.asarray(store.array("rgb")[store.n_steps - 1])
    assert last.std() > 10  # real frames were decoded into the tail, not zeros
