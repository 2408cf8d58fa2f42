"""Replay buffer speed at capacity 1M: fill rate, prioritized (sum-tree) and uniform sampling, priority updates.

Run: ``python benchmarks/replay_speed.py``. Target (issue): >= 100k sampled indices/s at capacity 1M with
prioritized replay, i.e. O(log n) sampling. The ring lives in shared memory, as in online training; the item
is one action chunk with To=2, S=31, Tp=16, Da=6, Ta=8 (about 0.9 kB, so 1M items take ~0.9 GB).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from _common import machine, parse_args, write_results
from dmrl.data.replay import ReplayBuffer, ReplayConfig

SPEC = {
    "obs": ((2, 31), np.float32),
    "action": ((16, 6), np.float32),
    "reward": ((8,), np.float32),
    "done": ((8,), np.bool_),
    "next_obs": ((2, 31), np.float32),
}
BATCH = 256


def _random_items(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    out = {}
    for k, (shape, dtype) in SPEC.items():
        out[k] = rng.random((n, *shape)) < 0.1 if dtype == np.bool_ else rng.standard_normal((n, *shape), np.float32)
    return out


def _rate(fn, n_items: int, seconds: float) -> float:
    """Items per second of calling fn() (each call handles n_items) for about `seconds` after one warm-up."""
    fn()
    calls, t0 = 0, time.perf_counter()
    while (dt := time.perf_counter() - t0) < seconds:
        fn()
        calls += 1
    return calls * n_items / dt


@dataclass
class Args:
    capacity: int = 1_000_000
    """replay capacity"""
    seconds: float = 3.0
    """time spent on each rate measurement"""


def main() -> None:
    args = parse_args(Args, __doc__)
    cap = args.capacity
    rng = np.random.default_rng(0)
    rows: list[dict] = []

    def row(measure: str, value: float, unit: str, target: str = "") -> None:
        rows.append({"measure": measure, "value": value, "unit": unit, "target": target})

    buf = ReplayBuffer(SPEC, ReplayConfig(capacity=cap, prioritized=True), shared=True)
    try:
        chunk = 10_000
        block = _random_items(rng, chunk)  # the same rows again and again: we time the copy, not the RNG
        t0 = time.perf_counter()
        for _ in range(cap // chunk):
            buf.add(block)
        buf.add({k: v[: cap % chunk] for k, v in block.items()})
        fill = time.perf_counter() - t0
        row(f"fill {cap} items, add() of {chunk} (owner: write + sync)", cap / fill, "items/s")
        small = {k: v[:8] for k, v in block.items()}
        writer = ReplayBuffer.attach(buf.handle())  # a collector's view: lock + write + counter, no tree
        row("collector add() of 8 items (attached view)", _rate(lambda: writer.add(small), 8, args.seconds), "items/s")
        writer.close()
        buf.sync()

        # Spread priorities over several orders of magnitude so the tree is not trivially flat.
        t0 = time.perf_counter()
        for start in range(0, cap, 65_536):
            idx = np.arange(start, min(start + 65_536, cap))
            buf.update_priorities(idx, rng.lognormal(0.0, 2.0, idx.shape))
        row("update_priorities, all slots in batches of 65536", cap / (time.perf_counter() - t0), "items/s")

        row(
            f"prioritized sample_indices (tree + weights), B={BATCH}",
            _rate(lambda: buf.sample_indices(BATCH, rng), BATCH, args.seconds),
            "indices/s",
            ">= 100000",
        )
        row(
            f"prioritized sample (indices + gather of all keys), B={BATCH}",
            _rate(lambda: buf.sample(BATCH, rng), BATCH, args.seconds),
            "indices/s",
            ">= 100000",
        )

        def step() -> None:  # what one critic step does with the buffer
            idx, _, _ = buf.sample(BATCH, rng)
            buf.update_priorities(idx, rng.standard_normal(BATCH))

        row(f"prioritized sample + update_priorities, B={BATCH}", _rate(step, BATCH, args.seconds), "indices/s")
        idx = buf.sample_indices(BATCH, rng)[0]
        td = rng.standard_normal(BATCH)
        row(
            f"update_priorities alone, B={BATCH}",
            _rate(lambda: buf.update_priorities(idx, td), BATCH, args.seconds),
            "items/s",
        )

        # Uniform sampling over the same shared data: an attached view whose config says prioritized=False.
        handle = buf.handle()
        uni = ReplayBuffer.attach(
            dataclasses.replace(handle, config=dataclasses.replace(handle.config, prioritized=False))
        )
        row(
            f"uniform sample_indices, B={BATCH}",
            _rate(lambda: uni.sample_indices(BATCH, rng), BATCH, args.seconds),
            "indices/s",
        )
        row(
            f"uniform sample (indices + gather of all keys), B={BATCH}",
            _rate(lambda: uni.sample(BATCH, rng), BATCH, args.seconds),
            "indices/s",
        )
        uni.close()
    finally:
        buf.close()
        buf.unlink()
    meta = {
        **machine(),
        "command": "python benchmarks/replay_speed.py" + (f" --capacity {cap}" if cap != 1_000_000 else ""),
        "note": "measured on a shared machine while another CPU-bound job ran; expect higher numbers when idle",
        "settings": f"capacity {cap}, shared memory, alpha 0.6, item = "
        + ", ".join(f"{k} {s} {np.dtype(d).name}" for k, (s, d) in SPEC.items()),
    }
    write_results("replay_speed", rows, meta, ["measure", "value", "unit", "target"])


if __name__ == "__main__":
    main()
