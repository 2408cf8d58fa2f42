"""Does a multimodal policy's encoder know which cup the instruction names? A probe of the auxiliary state head.

A policy trained with ``chunk.aux_state`` starting with 7 8 9 (MultiPath's state vector: the named cup's x, y, z)
predicts that cup's position from rgb + depth + joints + force + instruction. On fresh scenes (seeds the dataset
never saw) this script resets the env, encodes the first observation, and counts a scene as *bound* when the cup
nearest to the predicted position is the named one (chance: 1 / number of cups). It also reports the error of the
prediction in cm. It reads the head only: what the actions do with that knowledge is `dmrl eval`'s job.

    python benchmarks/mm_binding.py --checkpoint runs/mm/checkpoint --scenes 200 [--paraphrases heldout]
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from _common import parse_args
from dmrl.envs import make_env
from dmrl.policies.base import ChunkPolicy
from dmrl.policies.checkpoint import load_policy
from dmrl.policies.observations import roll_history, step_tensors
from dmrl.train.metrics import wilson_interval

TARGET_XYZ = [7, 8, 9]  # MultiPath state entries of the named cup's centre (see MultiPathEnv._state_vector)


@torch.inference_mode()
def binding(policy: ChunkPolicy, meta: dict, scenes: int, paraphrases: str, seed: int) -> dict:
    """A loaded policy (load_policy's pair) whose chunk.aux_state starts with TARGET_XYZ -> the probe's result."""
    keys = list(policy.chunk.obs_keys)
    env = make_env(meta["env_id"], **meta.get("env_kwargs", {}), paraphrases=paraphrases, obs_modes=keys)
    hits, errors = 0, []
    for i in range(scenes):
        obs, _ = env.reset(seed=seed + i)
        step, _ = step_tensors(obs, keys, torch.device("cpu"))  # what act() builds on an episode's first step
        batch = roll_history(None, step, torch.ones(1, dtype=torch.bool), policy.chunk.n_obs_steps)
        pooled = policy.encode(batch)
        pred = ((policy.aux_head(pooled) - policy.aux_offset) / policy.aux_scale)[0, :3].numpy()  # state units (m)
        task = env.unwrapped.task_state()
        nearest = int(np.argmin(np.linalg.norm(task.cups[:, :2] - pred[None, :2], axis=1)))
        hits += nearest == task.target
        errors.append(float(np.linalg.norm(task.cups[task.target, :2] - pred[:2])))
    env.close()
    lo, hi = wilson_interval(hits, scenes)
    return {
        "paraphrases": paraphrases,
        "scenes": scenes,
        "seed": seed,
        "bound": hits / scenes,
        "ci_low": lo,
        "ci_high": hi,
        "chance": 1.0 / len(task.cups),
        "xy_error_cm_median": 100 * float(np.median(errors)),
    }


@dataclass
class Args:
    checkpoint: Path
    """a multimodal run's checkpoint/ folder (chunk.aux_state starting with 7 8 9)"""
    scenes: int = 200
    """fresh scenes to probe"""
    paraphrases: Literal["train", "heldout"] = "train"
    """instruction paraphrase set"""
    seed: int = 100_000
    """first scene seed (collection uses 0 and up)"""
    out: Path | None = None
    """write the result as JSON here"""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(Args, __doc__.splitlines()[0], argv)
    if args.scenes < 1:
        print(f"--scenes: need at least 1, got {args.scenes}", file=sys.stderr)
        return 2
    if not (args.checkpoint / "config.json").is_file():
        print(f"--checkpoint {args.checkpoint}: no config.json there; pass a run's checkpoint/ folder", file=sys.stderr)
        return 2
    policy, meta = load_policy(args.checkpoint)
    aux = list(policy.chunk.aux_state)
    if aux[:3] != TARGET_XYZ:
        print(f"--checkpoint {args.checkpoint}: chunk.aux_state {aux} does not start with 7 8 9", file=sys.stderr)
        return 2
    res = {"checkpoint": str(args.checkpoint), **binding(policy, meta, args.scenes, args.paraphrases, args.seed)}
    print("| scenes | named cup nearest the prediction [95% CI] | chance | median xy error |")
    print("|---|---|---|---|")
    print(
        f"| {res['scenes']} ({res['paraphrases']}) | {100 * res['bound']:.0f}% "
        f"[{100 * res['ci_low']:.0f}, {100 * res['ci_high']:.0f}] | {100 * res['chance']:.0f}% "
        f"| {res['xy_error_cm_median']:.1f} cm |"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
