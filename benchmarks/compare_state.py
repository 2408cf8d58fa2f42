"""The policy comparison on MultiPathGrasp from state: MLP (Gaussian) vs VAE vs diffusion, seed-style table.

Run: ``python benchmarks/compare_state.py [--config configs/compare_state.yaml] [--out outputs/compare_state]``.
Writes benchmarks/results/compare_state.json and .md (one entry per policy with success_rate, ci_low, ci_high,
episodes, route_left, route_right, collision_rate, jerk, latency_ms), plus docs/compare_paths.png.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from _common import RESULTS, machine, parse_args
from dmrl.config_utils import load_yaml, merge
from dmrl.train.compare import CompareConfig, run_compare

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Args:
    config: Path = ROOT / "configs" / "compare_state.yaml"
    """the comparison preset (YAML)"""
    out: Path = ROOT / "outputs" / "compare_state"
    """dataset, runs and report go here"""


def main() -> None:
    args = parse_args(Args, __doc__)
    cfg = merge(CompareConfig(), {**load_yaml(args.config), "out": args.out})
    report = run_compare(cfg)
    report["meta"] = {**machine(), "command": " ".join(["python", *sys.argv]), "config": str(args.config)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compare_state.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    md = (args.out / "compare.md").read_text()
    meta = "".join(f"- {k}: {v}\n" for k, v in report["meta"].items())
    (RESULTS / "compare_state.md").write_text(f"# compare_state\n\n{md}\n{meta}")
    shutil.copy(args.out / "paths.png", ROOT / "docs" / "compare_paths.png")
    print(f"wrote {RESULTS / 'compare_state.json'} and .md, docs/compare_paths.png")


if __name__ == "__main__":
    main()
