"""Multimodal policy from images + proprio + instruction, and its robustness to a missing modality (issue 4).

Run: ``python benchmarks/multimodal.py [--steps N] [--episodes N]`` (collects outputs/multimodal/dataset.zarr with
rgb, depth, joints, force and instruction first if it is not there). Trains one policy on the multimodal encoder,
then evaluates it on the same seeds with every modality and with each modality of --drop withheld (the encoder
masks it; train with --modality-dropout > 0 so that it has seen missing modalities). Writes
benchmarks/results/multimodal.json and .md. ``--smoke`` runs a tiny network for a few steps and writes nothing to
benchmarks/results (a check that the pipeline runs, not a result).

Skeleton: the default sizes are a starting point, not a tuned recipe; nothing here has been run at full length.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import machine, write_results
from dmrl.config import TrainConfig, merge

ROOT = Path(__file__).resolve().parents[1]
MODES = ("rgb", "depth", "joints", "force", "instruction")
# --smoke: one block per network, D = 32, frozen MiniLM; seconds per step on a CPU.
SMOKE = {
    "multimodal": {
        "dim": 32,
        "vit": {"width": 32, "depth": 1, "n_heads": 2},
        "depth": {"width": 16, "depth": 1, "n_heads": 2},
        "perceiver": {"n_latents": 4, "n_heads": 2, "n_layers": 1},
    },
    "language": {"out_dim": 32, "trainable_layers": 0},
}


def collect_if_missing(path: Path, episodes: int, image_size: int) -> None:
    from dmrl.envs.collect import CollectConfig, collect

    if path.exists():
        return
    collect(CollectConfig(out=path, episodes=episodes, obs_modes=MODES, image_size=image_size, workers=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", type=Path, default=ROOT / "outputs" / "multimodal" / "dataset.zarr")
    ap.add_argument("--collect-episodes", type=int, default=300)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--policy", default="diffusion")
    ap.add_argument("--denoiser", default="transformer")
    ap.add_argument("--fusion", default="perceiver", choices=("perceiver", "concat"))
    ap.add_argument("--modality-dropout", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--drop", nargs="*", default=["depth", "rgb", "force", "instruction"])
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "multimodal")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()

    from dmrl.data import EpisodeStore
    from dmrl.train.checkpoint import load_policy
    from dmrl.train.evaluate import evaluate
    from dmrl.train.offline import train_bc

    collect_if_missing(args.dataset, 3 if args.smoke else args.collect_episodes, 16 if args.smoke else args.image_size)
    chunk = {
        "encoder_type": "multimodal",
        "obs_keys": list(MODES),
        "multimodal": {"fusion": args.fusion, "modality_dropout": args.modality_dropout},
    }
    if args.smoke:
        chunk["multimodal"] |= SMOKE["multimodal"]
        chunk["language"] = SMOKE["language"]
    denoiser_kwargs = {"d_model": 32, "n_layers": 1, "n_heads": 2} if args.smoke else {}
    cfg = merge(
        TrainConfig(),
        {
            "dataset": args.dataset,
            "out": args.out / f"{args.policy}_{args.fusion}",
            "policy": args.policy,
            "steps": 4 if args.smoke else args.steps,
            "batch_size": 8 if args.smoke else args.batch_size,
            "overwrite": True,
            "chunk": chunk,
            "diffusion": {"denoiser": args.denoiser, "denoiser_kwargs": denoiser_kwargs},
        },
    )
    summary = train_bc(cfg)
    policy, meta = load_policy(cfg.out / "checkpoint")
    env_id = EpisodeStore.open(args.dataset).attrs["env_id"]
    seeds = list(range(100_000, 100_000 + (2 if args.smoke else args.episodes)))
    rows = []
    for drop in [(), *((m,) for m in args.drop if m in MODES)]:
        ev = evaluate(policy, env_id, seeds, meta["env_kwargs"], n_envs=1 if args.smoke else 4, drop=drop)
        rows.append(
            {
                "dropped": ",".join(drop) or "none",
                "episodes": ev.episodes,
                "success_rate": ev.success_rate,
                "ci_low": ev.ci_low,
                "ci_high": ev.ci_high,
                "collision_rate": ev.collision_rate,
                "route_left": ev.route_left,
                "route_right": ev.route_right,
            }
        )
        print(rows[-1], flush=True)
    if args.smoke:
        print("--smoke: nothing written to benchmarks/results")
        return
    info = {
        **machine(),
        "command": "python benchmarks/multimodal.py " + " ".join(sys.argv[1:]),
        "policy": args.policy,
        "denoiser": args.denoiser,
        "fusion": args.fusion,
        "modality_dropout": args.modality_dropout,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "train_minutes": summary["train_seconds"] / 60,
    }
    write_results("multimodal", rows, info, list(rows[0]))


if __name__ == "__main__":
    main()
