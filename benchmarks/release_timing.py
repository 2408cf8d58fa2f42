"""When does a trained MultiPathGrasp policy plan to release the cup? A probe of chunk timing near an episode's end.

The expert switches suction off once, at the end of each demonstration (the episode ends the step after). For
observation windows taken k = 1 .. --max-k steps before that release in the dataset's own episodes, the script
samples the policy's chunk and reads the offset of the first suction-off action from the current step (chunk
index To - 1). A policy that learned the timing plans it at offset ~k; one that only ever saw windows far from
the end plans it at a fixed offset, and a receding horizon with Ta <= that offset never executes it (the arm
hovers over the pad until the episode times out). It reads demonstrations, not rollouts: what an evaluation does
with the plans is `dmrl eval`'s job.

    python benchmarks/release_timing.py --checkpoint runs/mm/checkpoint --dataset data/grasp_mm.zarr --name NAME
Writes benchmarks/results/release_timing_NAME.json and .md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from _common import machine, parse_args, write_results
from dmrl.data import EpisodeStore
from dmrl.policies.checkpoint import load_policy

SUCTION = 5  # MultiPath action index: suction > 0 on, <= 0 off


@torch.inference_mode()
def release_offsets(ckpt: Path, dataset: Path, episodes: int, max_k: int, seed: int) -> dict[int, np.ndarray]:
    """{k: (n,) planned release offsets} over the first `episodes` episodes of the store; 99 = none in the chunk."""
    policy, _ = load_policy(ckpt)
    policy.eval()
    store = EpisodeStore.open(dataset, "r")
    keys = [k for k in policy.chunk.obs_keys if k != "instruction"]
    arrays = {k: store.array(k) for k in keys}
    actions = np.asarray(store.array("actions")[: store.n_steps])
    instructions = store.instructions() if "instruction" in policy.chunk.obs_keys else None
    ends = np.asarray(store.episode_ends)
    to = policy.chunk.n_obs_steps
    out: dict[int, list[int]] = {k: [] for k in range(1, max_k + 1)}
    for e in range(min(episodes, store.n_episodes)):
        start = int(ends[e - 1]) if e else 0
        on = np.flatnonzero(actions[start : ends[e], SUCTION] > 0)
        if not len(on):
            continue
        release = start + int(on[-1]) + 1  # first suction-off step after the last suction-on one
        ks = [k for k in out if release - k - (to - 1) >= start]
        rows = np.array([[release - k - (to - 1) + j for j in range(to)] for k in ks])  # (n, To) global steps
        lo, hi = int(rows.min()), int(rows.max()) + 1  # one contiguous read per modality
        obs: dict = {k: torch.as_tensor(np.asarray(a[lo:hi])[rows.ravel() - lo]) for k, a in arrays.items()}
        obs = {k: v.reshape(len(ks), to, *v.shape[1:]) for k, v in obs.items()}
        if instructions is not None:
            obs["instruction"] = [instructions[e]] * len(ks)
        torch.manual_seed(seed + e)
        chunk = policy.predict_chunk(obs).numpy()[:, to - 1 :, SUCTION]  # (n, Tp - To + 1) from the current step
        for k, row in zip(ks, chunk, strict=True):
            off = np.flatnonzero(row <= 0)
            out[k].append(int(off[0]) if len(off) else 99)
    return {k: np.asarray(v) for k, v in out.items()}


@dataclass
class Args:
    checkpoint: Path
    """a run's checkpoint/ folder"""
    dataset: Path
    """the store the policy was trained on (or alike)"""
    name: str
    """results file suffix: release_timing_NAME"""
    episodes: int = 50
    """dataset episodes probed"""
    max_k: int = 10
    """largest k (steps before the release)"""
    seed: int = 0
    """sampling seed"""


def main() -> None:
    args = parse_args(Args, __doc__)
    if not (args.checkpoint / "config.json").is_file():
        sys.exit(f"--checkpoint {args.checkpoint}: no config.json; pass a run's checkpoint directory")
    if not args.dataset.exists():
        sys.exit(f"--dataset {args.dataset}: not found; pass the zarr store the policy was trained on")
    if args.episodes < 1 or args.max_k < 1:
        sys.exit(f"--episodes / --max-k: need >= 1, got {args.episodes} / {args.max_k}")
    torch.set_num_threads(1)
    offsets = release_offsets(args.checkpoint, args.dataset, args.episodes, args.max_k, args.seed)
    rows = [
        {
            "steps_to_release": k,
            "windows": len(v),
            "planned_offset_median": float(np.median(v)),
            "planned_exactly": float(np.mean(v == k)),
            "within_ta4": float(np.mean(v < 4)),
            "within_ta8": float(np.mean(v < 8)),
        }
        for k, v in offsets.items()
        if len(v)
    ]
    info = {**machine(), "command": "python benchmarks/release_timing.py " + " ".join(sys.argv[1:])}
    cols = ["steps_to_release", "windows", "planned_offset_median", "planned_exactly", "within_ta4", "within_ta8"]
    write_results(f"release_timing_{args.name}", rows, info, cols)


if __name__ == "__main__":
    main()
