"""dmrl data import / export throughput and memory: a generated LeRobotDataset v3 (one camera + state + actions) and a
robomimic-style HDF5 file of the same size, imported into an episode store; the LeRobot store exported back.

Run: ``python benchmarks/data_import.py`` (defaults: 20 and 60 episodes x 100 frames of 96 x 96). Each measurement
runs in a fresh process; peak_rss_mb is that process's peak resident memory (ru_maxrss), which includes what loading
dmrl's modules (torch) costs: the baseline row. decoded_mb is the size of the dataset's frames as uint8 arrays: an
import that held the dataset in memory would need at least that much on top. Sources are written by
tests/data/importers/fixtures.py (the LeRobot layout as lerobot's writer lays it out; libx264 for the mp4 here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from _common import machine, parse_args, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "data" / "importers"))

CHILD = """
import json, resource, sys, time
from pathlib import Path
from dmrl.data.importers.cli import ExportConfig, ImportConfig, run_export, run_import
kind, src, out = sys.argv[1:4]
t = time.perf_counter()
if kind == "baseline":  # load every module an import or export loads (torch through dmrl.data), do no work
    import av, h5py, pyarrow.parquet
    import dmrl.data.importers.lerobot, dmrl.data.importers.hdf5, dmrl.data.importers.lerobot_export
elif kind == "export":
    run_export(ExportConfig(store=Path(src), out=Path(out), vcodec="libx264"))
else:
    run_import(ImportConfig(source=Path(src), out=Path(out)), progress=False)
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


@dataclass
class Args:
    episodes: tuple[int, ...] = (20, 60)
    """episodes in each generated dataset, one dataset per value (peak memory should not grow with it)"""
    length: int = 100
    """frames per episode"""
    image_size: int = 96
    """H = W of the camera"""


def _run(kind: str, src: Path, out: Path) -> dict:
    env = {**os.environ, "SVT_LOG": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(src), str(out)], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"{kind} {src} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _measure(episodes: int, args: Args, baseline: bool) -> list[dict]:
    from fixtures import write_lerobot_v3, write_robomimic

    lengths = (args.length,) * episodes
    hw = (args.image_size, args.image_size)
    frames = episodes * args.length
    decoded_mb = round(frames * hw[0] * hw[1] * 3 / 2**20, 1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        cams = ("observation.images.front",)
        write_lerobot_v3(t / "lerobot", lengths=lengths, hw=hw, episodes_per_file=10, cams=cams, vcodec="libx264",
                         keep_frames=False)  # fmt: skip
        write_robomimic(t / "rm.hdf5", lengths=lengths, hw=hw)
        runs = [("-", "baseline", t, t)] if baseline else []  # python + dmrl's imports: in every peak_rss_mb
        runs += [
            ("lerobot", "import", t / "lerobot", t / "lerobot.zarr"),
            ("hdf5", "import", t / "rm.hdf5", t / "rm.zarr"),
            ("lerobot", "export", t / "lerobot.zarr", t / "exported"),
        ]
        for fmt, kind, src, out in runs:
            r = _run(kind, src, out)
            size = {"episodes": episodes, "frames": frames, "image": f"{hw[0]}x{hw[1]}", "decoded_mb": decoded_mb}
            rows.append(
                {
                    "format": fmt,
                    "direction": kind,
                    **(size if kind != "baseline" else {}),
                    "seconds": round(r["seconds"], 2),
                    "frames_per_s": round(frames / r["seconds"], 1) if kind != "baseline" else "",
                    "peak_rss_mb": round(r["peak_rss_mb"], 1),
                }
            )
    return rows


def main() -> None:
    args = parse_args(Args, __doc__)
    rows = []
    for i, n in enumerate(args.episodes):
        rows += _measure(n, args, baseline=i == 0)
    meta = {**machine(), "command": "python benchmarks/data_import.py " + " ".join(sys.argv[1:])}
    columns = [
        "format",
        "direction",
        "episodes",
        "frames",
        "image",
        "decoded_mb",
        "seconds",
        "frames_per_s",
        "peak_rss_mb",
    ]
    write_results("data_import", rows, meta, columns)


if __name__ == "__main__":
    main()
