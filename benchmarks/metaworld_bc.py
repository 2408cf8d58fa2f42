"""Meta-World behaviour cloning with the 3D Diffusion Policy paper's protocol (Ze et al. RSS 2024; issue 28 §2).

Per task and training seed: ``--demos`` scripted demonstrations (``dmrl collect``, seeds 0..; 200-step episodes,
fresh layout each), a diffusion policy from RGB + proprio (``--chunk.obs-keys rgb joints``, ResNet encoder), an
evaluation point every ``--curve-every`` training steps on ``--curve-episodes`` episodes (seeds 100000..; success
at any step of a 200-step episode), and both scores: the mean of the 5 best points (their protocol's number,
optimistic) and the final point. Published numbers (their Table I/XVIII, Meta-World v2) are listed beside ours
(v3 on MuJoCo 4): compare in protocol, not to the decimal.

Run: ``python benchmarks/metaworld_bc.py --tasks button-press-v3 --seeds 0 --steps 300 --curve-every 100``.
Defaults are a small run (one easy task, one seed, a short budget): the result is labelled ``small run`` and is
no reproduction of the paper's budget (3000 epochs on a GPU). Writes benchmarks/results/metaworld_bc.json / .md
(the issue's final table is ``metaworld.json``, not written here). Runs live in outputs/metaworld_bc/.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import machine, parse_args, write_results
from dmrl.cli import main as dmrl

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "metaworld_bc"
#: Published success (%) of image-based Diffusion Policy / DP3, their Table I/XVIII (Meta-World v2).
PUBLISHED = {
    "button-press-v3": (99, 100),
    "door-open-v3": (98, 99),
    "drawer-open-v3": (93, 100),
    "assembly-v3": (15, 99),
    "pick-place-v3": (0, 12),
}


@dataclass
class Args:
    tasks: list[str] = field(default_factory=lambda: ["button-press-v3"])
    """Meta-World task names (metaworld/<task> envs)."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Training seeds (the protocol: 3)."""
    demos: int = 10
    """Scripted demonstrations per task."""
    steps: int = 300
    """Training steps per run."""
    curve_every: int = 100
    """Steps between evaluation points."""
    curve_episodes: int = 20
    """Evaluation episodes per point."""
    batch_size: int = 16
    """Training batch size."""
    label: str = "small run"
    """Written beside every row: what budget this is."""


def run(task: str, seed: int, a: Args) -> dict:
    data = OUT / f"{task}_demos{a.demos}.zarr"
    if not data.exists():
        modes = "rgb,joints,instruction,state"
        argv = ["collect", "--env", f"metaworld/{task}", "--episodes", str(a.demos), "--obs-modes", modes]
        assert dmrl([*argv, "--out", str(data), "--workers", "2"]) == 0
    out = OUT / f"{task}_seed{seed}_steps{a.steps}"
    argv = ["train", "--dataset", str(data), "--out", str(out), "--overwrite", "--seed", str(seed)]
    argv += ["--steps", str(a.steps), "--batch-size", str(a.batch_size), "--chunk.obs-keys", "rgb", "joints"]
    argv += ["--chunk.encoder.type", "multimodal", "--chunk.encoder.rgb-encoder", "resnet"]
    argv += ["--source.curve-every", str(a.curve_every), "--source.curve-episodes", str(a.curve_episodes)]
    argv += ["--eval-envs", "2", "--source.val-fraction", "0"]  # all demos train (the default holds 5% out)
    t = time.perf_counter()
    assert dmrl(argv) == 0
    minutes = (time.perf_counter() - t) / 60
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [(m["step"], m["curve_success"]) for m in lines if "curve_success" in m]
    if not curve:
        raise SystemExit(f"{out}: no evaluation point (steps {a.steps} < --curve-every {a.curve_every}?)")
    best5 = sorted((s for _, s in curve), reverse=True)[:5]
    dp, dp3 = PUBLISHED.get(task, (None, None))
    return {
        "task": task,
        "policy": "diffusion",
        "seed": seed,
        "success_top5": sum(best5) / len(best5),
        "success_final": curve[-1][1],
        "points": len(curve),
        "curve": " ".join(f"{step}:{s:.2f}" for step, s in curve),
        "train_minutes": round(minutes, 1),
        "published_dp": dp,
        "published_dp3": dp3,
        "budget": a.label,
    }


def main() -> None:
    a = parse_args(Args, __doc__)
    rows = [run(task, seed, a) for task in a.tasks for seed in a.seeds]
    meta = {
        **machine(),
        "command": " ".join(["python", "benchmarks/metaworld_bc.py", *sys.argv[1:]]),
        "protocol": f"{a.demos} demos, 200-step episodes, a point every {a.curve_every} steps x {a.curve_episodes} "
        "episodes (seeds 100000..), top-5 mean and final",
        "label": a.label,
        "published": "Ze et al. RSS 2024 Table I/XVIII, image DP / DP3, Meta-World v2 (ours: v3, MuJoCo 4)",
    }
    write_results("metaworld_bc", rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
