"""Shared helpers for benchmark scripts: argument parsing, machine description and result writing (JSON + markdown)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(cls: type[T], doc: str | None, argv: list[str] | None = None, allow_empty: tuple[str, ...] = ()) -> T:
    """The script's flags from a dataclass ``cls`` (tyro, as the ``dmrl`` CLI): one kebab-case flag per field, its
    docstring the help; ``argv`` defaults to sys.argv[1:]. A boolean field is one ``--flag`` (no ``--no-flag``). A list
    flag given with no values is an error (as argparse's ``nargs="+"``) unless its field is in ``allow_empty``."""
    import dataclasses

    import tyro

    args = tyro.cli(cls, args=argv, description=doc, config=(tyro.conf.FlagCreatePairsOff,))
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, list) and not value and f.name not in allow_empty:
            print(f"--{f.name.replace('_', '-')}: expected at least one value", file=sys.stderr)
            raise SystemExit(2)
    return args


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        import mujoco

        mujoco_version = mujoco.__version__
    except ImportError:  # e.g. a GPU box that only runs gpu_check.py
        mujoco_version = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        # A result measured with uncommitted changes says so: -dirty when tracked files differ from HEAD. Results
        # files are outputs, not code: a chained run (one arm's results not yet committed) is not dirty for them.
        dirty = (
            subprocess.run(
                ["git", "diff", "--quiet", "HEAD", "--", ".", ":(exclude)benchmarks/results"], capture_output=True
            ).returncode
            != 0
        )
        commit += "-dirty" if commit and dirty else ""
    except OSError:
        commit = ""
    return {
        "cpu": cpu,
        "cores_available": len(os.sched_getaffinity(0)),
        "python": sys.version.split()[0],
        "mujoco": mujoco_version,
        "mujoco_gl": os.environ.get("MUJOCO_GL"),
        "platform": platform.platform(),
        "git_commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_results(name: str, rows: list[dict], meta: dict, columns: list[str]) -> None:
    """Print a table and write benchmarks/results/<name>.json and .md."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    body = "".join("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |\n" for r in rows)
    table = header + body
    print(table)
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    md = f"# {name}\n\n{table}\n" + "".join(f"- {k}: {v}\n" for k, v in meta.items())
    (RESULTS / f"{name}.md").write_text(md)
    print(f"wrote {RESULTS / name}.json and .md")


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def median_ms(fn: Callable[[], object], reps: int, warmup: int) -> float:
    """Median wall time in ms of ``reps`` calls of ``fn``, after ``warmup`` untimed calls."""
    import numpy as np

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


class LoadSampler:
    """The 1-minute load average every 30 s in a daemon thread: how shared the machine was during a run."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(30):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children so far."""
    import resource

    usages = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usages)


@contextmanager
def timed_segment(path: Path, segments: list[dict]) -> Iterator[None]:
    """Time one segment of a (resumable) training run: its wall and CPU minutes and the load every 30 s are appended
    to ``segments`` (the earlier segments) and the list is written to ``path`` on the way out, also when the segment
    is interrupted or fails, so a resumed run's minutes add up."""
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    with LoadSampler() as load:
        try:
            yield
        finally:
            minutes = (time.perf_counter() - t0) / 60
            segments.append({"minutes": minutes, "cpu_minutes": (_cpu_seconds() - cpu0) / 60, "load": load.samples})
            path.write_text(json.dumps(segments))


def segment_totals(segments: list[dict]) -> dict:
    """Wall and CPU minutes summed over the segments (an unrecorded one, minutes None, counts 0 and makes
    minutes_complete false), their count, and the mean and max load sampled during them."""
    loads = [x for s in segments for x in s["load"]]
    return {
        "wall_minutes": round(sum(s["minutes"] or 0 for s in segments), 1),
        "cpu_minutes": round(sum(s["cpu_minutes"] or 0 for s in segments), 1),
        "segments": len(segments),
        "minutes_complete": all(s["minutes"] is not None for s in segments),
        "load_mean": round(sum(loads) / max(len(loads), 1), 2),
        "load_max": round(max(loads, default=0.0), 2),
    }
