"""A LeRobot dataset whose decoded frames are 2.4x the memory the import process may add still imports: the import
streams one episode at a time (the process's address space is capped with RLIMIT_AS after its modules are loaded)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from fixtures import write_lerobot_v3

from dmrl.data import EpisodeStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")

HEADROOM = 64 << 20  # bytes of address space the import may add over what the warmed-up process holds
LENGTHS, HW = (200,) * 14, (128, 128)
DECODED = sum(LENGTHS) * HW[0] * HW[1] * 3  # 138 MB of uint8 frames: more than twice the headroom

CHILD = textwrap.dedent(
    """
    import resource, sys
    from pathlib import Path
    import numpy as np
    from dmrl.data.importers.cli import ImportConfig, run_import

    small, big, out, headroom, decoded = sys.argv[1:4] + [int(a) for a in sys.argv[4:6]]
    import zarr
    zarr.config.set({"async.concurrency": 2})  # zarr's own parallel chunk buffers are not what this test measures
    # Warm up on a tiny dataset first: modules, codec and zarr threads exist before the cap.
    run_import(ImportConfig(source=Path(small), out=Path(out + ".warm")), progress=False)
    vm = next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, vm + headroom))
    try:
        np.ones(decoded, np.uint8)  # the whole dataset at once does not fit under the cap
        sys.exit("the memory cap does not bind")
    except MemoryError:
        pass
    print("steps", run_import(ImportConfig(source=Path(big), out=Path(out)), progress=False)["steps"])
    """
)


def _small_thread_stacks() -> None:
    """In the child before exec: glibc sizes every new thread's stack from RLIMIT_STACK (8 MB here), and each
    reservation counts against RLIMIT_AS. Threads the codec or zarr start only after the cap (a decoder thread
    per core, executor workers) would then eat the headroom by their count, not by what the import holds: the
    test failed 1 time in 3 that way. 2 MB stacks, and zarr writing 2 chunks at a time instead of 10 (each with
    its own temporaries; with the small stacks alone it still failed 1 in 10), leave it measuring the import's own
    memory."""
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    soft = 2 << 20 if hard == resource.RLIM_INFINITY else min(2 << 20, hard)
    resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))


def test_import_larger_than_the_memory_cap_streams(tmp_path):
    assert DECODED > 2 * HEADROOM
    big, small, out = tmp_path / "big", tmp_path / "small", tmp_path / "out.zarr"
    cams = ("observation.images.top",)
    write_lerobot_v3(big, lengths=LENGTHS, hw=HW, episodes_per_file=4, cams=cams, vcodec="libx264", keep_frames=False)
    write_lerobot_v3(small, lengths=(3, 2), hw=(64, 64), cams=cams, vcodec="libx264")
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "SVT_LOG": "1"}  # one malloc arena per thread would reserve 64 MB
    argv = [sys.executable, "-c", CHILD, str(small), str(big), str(out), str(HEADROOM), str(DECODED)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, preexec_fn=_small_thread_stacks)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["steps", str(sum(LENGTHS))]
    store = EpisodeStore.open(out)
    assert store.n_episodes == len(LENGTHS) and store.obs_spec["rgb"] == ((3, *HW), "uint8")
    last = np.asarray(store.array("rgb")[store.n_steps - 1])
    assert last.std() > 10  # real frames were decoded into the tail, not zeros
