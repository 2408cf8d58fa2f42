"""Results tables generated from the benchmark files, so the numbers in README.md and docs/results.md cannot drift.

Each generated region sits between ``<!-- results:NAME:begin -->`` and ``<!-- results:NAME:end -->``. The text
between the markers is rebuilt from ``benchmarks/results/*.json``; everything outside them is left alone.

    python scripts/results_table.py           # rewrite the regions in place
    python scripts/results_table.py --check   # exit 1, naming the file, if a region differs from the JSON files
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tyro

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"


@dataclass
class Args:
    """Rewrite (or check) the generated results tables in README.md and docs/results.md."""

    check: bool = False
    """Write nothing; exit 1 with a one-line message naming the file if a region differs from the JSON files."""
    root: Path = REPO_ROOT
    """Repository root holding README.md and docs/results.md."""
    results: Path | None = None
    """Directory of the benchmark JSON files; default ROOT/benchmarks/results."""


# ---------------------------------------------------------------- formatting


def pct(x: float, digits: int = 0) -> str:
    """0.933 -> '93%' (digits=0) or '93.3%' (digits=1)."""
    return f"{100 * x:.{digits}f}%"


def num(x: float, digits: int = 0) -> str:
    """A percentage without its sign: 0.0908 -> '9' or '9.1'."""
    return f"{100 * x:.{digits}f}"


def digits(episodes: int) -> int:
    """Decimals of a rate over EPISODES: none up to 200 episodes, one above (runs pooled over training seeds)."""
    return 0 if episodes <= 200 else 1


def success(rate: float, low: float, high: float, episodes: int) -> str:
    """Success with its 95% interval: '93% [86, 97]' or, above 200 episodes, '12.3% [9.1, 16.5]'."""
    d = digits(episodes)
    return f"{pct(rate, d)} [{num(low, d)}, {num(high, d)}]"


def thousands(x: float) -> str:
    """1251.2 -> '1,251'."""
    return f"{x:,.0f}"


def sig(x: float, digits: int = 3) -> str:
    """A value to `digits` significant digits, without exponent for ordinary magnitudes: 2.895 -> '2.9' (2 digits)."""
    return f"{float(f'{x:.{digits}g}'):g}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def link(prefix: str, name: str) -> str:
    """A link to benchmarks/results/NAME.md, relative to the page (prefix '' for README.md, '../' for docs/)."""
    return f"[{name}.md]({prefix}{RESULTS}/{name}.md)"


# ---------------------------------------------------------------- reading


class Results:
    """The benchmark JSON files of one directory, read once each."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache: dict[str, dict] = {}

    def __call__(self, name: str) -> dict:
        if name not in self._cache:
            path = self.directory / f"{name}.json"
            if not path.is_file():
                raise FileNotFoundError(f"{path}: benchmark results file not found")
            self._cache[name] = json.loads(path.read_text())
        return self._cache[name]

    def rows(self, name: str) -> list[dict]:
        return self(name)["results"]

    def row(self, name: str, key: str, value: object) -> dict:
        """The one row of NAME whose KEY equals VALUE."""
        found = [r for r in self.rows(name) if r.get(key) == value]
        if len(found) != 1:
            raise KeyError(f"{name}.json: expected one row with {key} = {value!r}, found {len(found)}")
        return found[0]


def _ci(r: dict, rate_key: str = "success_rate") -> str:
    return success(r[rate_key], r["ci_low"], r["ci_high"], r["episodes"])


# ---------------------------------------------------------------- tables


COMPARE_LABELS = {"gaussian": "MLP (Gaussian)", "vae": "VAE (conditional)", "diffusion": "Diffusion (x0, DDIM-10)"}
RL_OFFLINE_LABELS = {
    "bc": "BC (diffusion)",
    "diffusion-ql-aw": "Diffusion-QL, advantage-weighted, eta 0 (BC variant)",
    "diffusion-ql-aw-bon": "advantage-weighted actor, best-of-32 by the critic",
    "diffusion-ql": "Diffusion-QL (Q-gradient term)",
    "td3-bc": "TD3+BC (Gaussian MLP actor)",
    "qc": "QC (BC proposal, best-of-32, in-support backup)",
    "idql": "IDQL (IQL critic, best-of-32)",
    "fql": "FQL (one-step student)",
}
FINETUNE_LABELS = {
    "bc": "BC only, 2000 steps",
    "bc_rl": "BC → online, self-imitation (eta 0)",
    "scratch": "online from scratch",
    "qc": "BC → online QC (best-of-32 by the critic)",
}
OFFLINE_HEADLINE = ("bc", "diffusion-ql-aw", "qc", "diffusion-ql-aw-bon")
FINETUNE_HEADLINE = ("bc", "bc_rl", "qc")
#: Online at a fixed replay ratio (20 env steps per update): (results file, arm, label, env-step budget).
PACE_HEADLINE = (
    ("rl_finetune_pace", "bc_rl", "self-imitation (eta 0)", "200k"),
    ("rl_finetune_pace_eta0.001", "bc_rl", "Q term (Diffusion-QL eta 0.001) + self-imitation", "200k"),
    ("rl_finetune_pace500k_eta0.001", "bc_rl", "Q term (Diffusion-QL eta 0.001) + self-imitation", "500k"),
)


def headline(res: Results, prefix: str) -> str:
    """The README's one table: the headline success of each benchmark, with its file."""
    rows: list[list[str]] = []
    src = link(prefix, "compare_state")
    for policy in ("gaussian", "vae", "diffusion"):
        r = res.row("compare_state", "policy", policy)
        rows.append(["policy comparison (Grasp, state)", COMPARE_LABELS[policy], _ci(r), str(r["episodes"]), src])
    src = link(prefix, "multimodal")
    for entry, label in (("train_paraphrases", "train"), ("heldout_paraphrases", "held-out")):
        r = res.row("multimodal", "entry", entry)
        rows.append(
            ["multimodal encoder (Grasp, RGB-D + joints + force + language)", f"diffusion, {label} paraphrases"]
            + [_ci(r), str(r["episodes"]), src]
        )
    src = link(prefix, "rl_offline")
    for algo in OFFLINE_HEADLINE:
        r = res.row("rl_offline", "algo", algo)
        rows.append(
            ["offline RL (Grasp, mixed-quality data)", RL_OFFLINE_LABELS[algo], _ci(r), str(r["episodes"]), src]
        )
    src = link(prefix, "rl_finetune")
    for arm in FINETUNE_HEADLINE:
        r = res.row("rl_finetune", "arm", arm)
        rate = success(r["final_success"], r["ci_low"], r["ci_high"], r["episodes"])
        rows.append(["online fine-tuning (Grasp, 20 weak demos)", FINETUNE_LABELS[arm], rate, str(r["episodes"]), src])
    for name, arm, label, budget in PACE_HEADLINE:
        r = res.row(name, "arm", arm)
        rate = success(r["final_success"], r["ci_low"], r["ci_high"], r["episodes"])
        bench = f"online fine-tuning, 20 env steps per update (Grasp, {budget} env steps)"
        rows.append([bench, f"BC → online, {label}", rate, str(r["episodes"]), link(prefix, name)])
    src = link(prefix, "experts")
    for env in ("dmrl/MultiPathGrasp-v0", "dmrl/MultiPathReach-v0"):
        r = next(x for x in res.rows("experts") if x["env"] == env and x["policy"] == "expert")
        task = env.split("/")[1].removeprefix("MultiPath").removesuffix("-v0")
        rows.append([f"scripted expert ({task})", "expert, from privileged state", _ci(r), str(r["episodes"]), src])
    return table(["benchmark", "policy / arm", "success [95% CI]", "episodes", "file"], rows)


def compare_table(res: Results, prefix: str) -> str:
    rows = []
    for policy in ("gaussian", "vae", "diffusion"):
        r = res.row("compare_state", "policy", policy)
        rows.append(
            [
                COMPARE_LABELS[policy],
                r["action_generation"],
                _ci(r),
                f"{pct(r['route_left'])} / {pct(r['route_right'])} / {pct(r['route_none'])}",
                pct(r["collision_rate"], digits(r["episodes"])),
                f"{r['jerk']:.3f}",
                f"{r['latency_ms']:.2f} / {r['latency_p95_ms']:.2f}",
            ]
        )
    header = ["policy", "action generation", "success [95% CI]", "route L / R / none", "collisions", "jerk"]
    return table(header + ["latency ms (median / p95)"], rows) + f"\n\nFile: {link(prefix, 'compare_state')}."


def ddim_table(res: Results, prefix: str) -> str:
    rows = [
        [
            str(r["ddim_steps"]),
            _ci(r),
            pct(r["collision_rate"], digits(r["episodes"])),
            f"{pct(r['route_left'])} / {pct(r['route_right'])}",
            sig(r["chunk_latency_ms"]),
        ]
        for r in res.rows("ablation_ddim_steps")
    ]
    header = ["DDIM steps", "success [95% CI]", "collisions", "route L / R", "ms per chunk"]
    return table(header, rows) + f"\n\nFile: {link(prefix, 'ablation_ddim_steps')}."


def multimodal_table(res: Results, prefix: str) -> str:
    rows = []
    for r in res.rows("multimodal"):
        if "success_rate" not in r or r.get("recovery_episodes", 0) == 0:
            continue
        what = f"{r['paraphrases']} paraphrases" + (f", {r['dropped']} withheld" if r["dropped"] != "none" else "")
        rows.append(
            [
                what,
                str(r["episodes"]),
                _ci(r),
                pct(r["collision_rate"], digits(r["episodes"])),
                f"{pct(r['grasp_wrong'])} / {pct(r['grasp_none'])}",
                r["git_commit"],
            ]
        )
    header = ["evaluation (seeds 100000..)", "episodes", "success [95% CI]", "collisions", "first grasp wrong / none"]
    out = table(header + ["commit"], rows)
    binding = [
        [r["paraphrases"], str(r["episodes"]), success(r["bound"], r["ci_low"], r["ci_high"], 100)]
        + [f"{r['xy_error_cm']:.1f}", pct(r["chance"])]
        for r in res.rows("multimodal")
        if "bound" in r
    ]
    header = ["binding probe", "scenes", "named cup found [95% CI]", "xy error cm", "chance"]
    return out + "\n\n" + table(header, binding) + f"\n\nFile: {link(prefix, 'multimodal')}."


def multimodal_ablation_table(res: Results, prefix: str) -> str:
    by_arm: dict[str, dict[str, dict]] = {}
    for r in res.rows("multimodal"):
        if "success_rate" in r and r.get("recovery_episodes", 0) == 0 and r["dropped"] == "none":
            arm = r["entry"].rsplit("_", 1)[0]
            by_arm.setdefault(arm, {})[r["paraphrases"]] = r
    rows = []
    for arm, p in by_arm.items():
        t, h = p["train"], p["heldout"]
        rows.append(
            [arm, _ci(t), _ci(h), f"{pct(t['grasp_wrong'])} / {pct(h['grasp_wrong'])}"]
            + [f"{t['train_minutes']:.1f} ({t['samples_per_s']:.0f})", t["git_commit"]]
        )
    header = ["arm", "train paraphrases", "held-out paraphrases", "wrong cup (train / held-out)"]
    return table(header + ["train min (samples/s)", "commit"], rows) + f"\n\nFile: {link(prefix, 'multimodal')}."


def rl_offline_table(res: Results, prefix: str) -> str:
    rows = [
        [
            RL_OFFLINE_LABELS.get(r["algo"], r["algo"]),
            "yes" if r.get("critic_guided") else "no",
            _ci(r),
            r["per_seed"],
            pct(r["collision_rate"], digits(r["episodes"])),
            f"{r['train_min']:.1f}",
            r["git_commit"],
        ]
        for r in res.rows("rl_offline")
    ]
    header = ["algorithm", "critic steers", "success [95% CI]", "per seed", "collisions", "train min / run", "commit"]
    return table(header, rows) + f"\n\nFile: {link(prefix, 'rl_offline')}."


def _steps_to(r: dict) -> str:
    steps = r["env_steps_to_threshold"]
    if steps is None:
        return "n/a"
    return " / ".join("never" if s is None else f"{s / 1000:.0f}k" for s in steps)


def rl_finetune_table(res: Results, prefix: str) -> str:
    rows = [
        [
            FINETUNE_LABELS.get(r["arm"], r["arm"]),
            "yes" if r.get("critic_guided") else "no",
            success(r["final_success"], r["ci_low"], r["ci_high"], r["episodes"]),
            r["per_seed"],
            pct(r["collision_rate"], digits(r["episodes"])),
            f"{r['env_steps'] / 1000:.0f}k" if r["env_steps"] else "0",
            _steps_to(r),
        ]
        for r in res.rows("rl_finetune")
    ]
    header = ["arm", "critic steers", "success [95% CI]", "per seed", "collisions", "env steps"]
    header += ["env steps to BC + 10 points"]
    return table(header, rows) + f"\n\nFile: {link(prefix, 'rl_finetune')}."


def rl_per_table(res: Results, prefix: str) -> str:
    labels = {"bc_rl": "prioritized (alpha 0.6, beta 0.4 → 1)", "bc_rl_uniform": "uniform"}
    rows = [
        [
            labels.get(r["arm"], r["arm"]),
            success(r["final_success"], r["ci_low"], r["ci_high"], r["episodes"]),
            r["per_seed"],
            pct(r["collision_rate"], digits(r["episodes"])),
            " / ".join(f"{d:.3g}" for d in r["drawdown"]),
        ]
        for r in res.rows("rl_per")
    ]
    header = ["replay (eta 0.05)", "success [95% CI]", "per seed", "collisions", "drawdown per seed"]
    return table(header, rows) + f"\n\nFile: {link(prefix, 'rl_per')}."


def rl_truncation_table(res: Results, prefix: str) -> str:
    rows = [
        [
            r["algo"],
            thousands(r["samples_per_s"]),
            f"{r['speedup_vs_full']:.2f}×",
            _ci(r),
            pct(r["collision_rate"], digits(r["episodes"])),
        ]
        for r in res.rows("rl_truncation")
    ]
    header = ["gradient through the last k DDIM steps", "samples/s (batch 128)", "vs full", "success [95% CI]"]
    return table(header + ["collisions"], rows) + f"\n\nFile: {link(prefix, 'rl_truncation')}."


def experts_table(res: Results, prefix: str) -> str:
    rows = []
    for r in res.rows("experts"):
        routes = "–" if r["route_left"] == "" else f"{r['route_left']:.2f} / {r['route_right']:.2f}"
        rows.append(
            [
                r["env"].split("/")[1],
                r["policy"],
                str(r["episodes"]),
                _ci(r),
                routes,
                pct(r["collision_rate"], digits(r["episodes"])),
            ]
        )
    header = ["env", "policy", "episodes", "success [95% CI]", "left / right", "collisions"]
    return table(header, rows) + f"\n\nFile: {link(prefix, 'experts')}."


def export_table(res: Results, prefix: str) -> str:
    rows = [
        [r["policy"], str(r["network_calls"]), sig(r["torch_ms"]), sig(r["onnxruntime_ms"]), f"{r['max_abs_diff']:.0e}"]
        for r in res.rows("export_latency")
    ]
    header = ["policy", "network calls", "torch ms", "onnxruntime ms", "max abs diff"]
    return table(header, rows) + f"\n\nFile: {link(prefix, 'export_latency')}."


def env_speed_table(res: Results, prefix: str) -> str:
    rows = [[r["measure"], sig(r["value"]), r["target"]] for r in res.rows("env_speed")]
    return table(["measure", "value", "target"], rows) + f"\n\nFile: {link(prefix, 'env_speed')}."


def engine_table(res: Results, prefix: str) -> str:
    rows = [
        [r["setting"], str(r["global_batch"]), thousands(r["samples_per_s"])] for r in res.rows("engine_throughput")
    ]
    header = ["setting", "global batch", "samples/s"]
    return table(header, rows) + f"\n\nFile: {link(prefix, 'engine_throughput')}."


Render = Callable[[Results, str], str]

# file (relative to the root) -> (link prefix from that file to the root, {region name: renderer})
REGIONS: dict[str, tuple[str, dict[str, Render]]] = {
    "README.md": ("", {"headline": headline}),
    "docs/results.md": (
        "../",
        {
            "headline": headline,
            "compare": compare_table,
            "ddim": ddim_table,
            "multimodal": multimodal_table,
            "multimodal_ablation": multimodal_ablation_table,
            "rl_offline": rl_offline_table,
            "rl_finetune": rl_finetune_table,
            "rl_per": rl_per_table,
            "rl_truncation": rl_truncation_table,
            "experts": experts_table,
            "export": export_table,
            "env_speed": env_speed_table,
            "engine": engine_table,
        },
    ),
}


# ---------------------------------------------------------------- regions


def replace_region(text: str, name: str, body: str, path: Path) -> str:
    """TEXT with the lines between NAME's begin and end markers replaced by BODY."""
    begin, end = f"<!-- results:{name}:begin -->", f"<!-- results:{name}:end -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    matches = pattern.findall(text)
    if len(matches) != 1:
        raise ValueError(f"{path}: expected one '{begin}' ... '{end}' region, found {len(matches)}")
    # A function replacement, so backslashes in the body are never read as group references.
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text)


def generate(root: Path, results: Path) -> dict[Path, tuple[str, str]]:
    """{file: (current text, text with every region rebuilt from RESULTS)} for each file that has regions."""
    res = Results(results)
    out = {}
    for rel, (prefix, regions) in REGIONS.items():
        path = root / rel
        old = path.read_text()
        new = old
        for name, render in regions.items():
            new = replace_region(new, name, render(res, prefix), path)
        out[path] = (old, new)
    return out


def main(args: Args) -> int:
    """Rewrite the regions, or with ``check`` report the first file whose regions are stale; returns the exit code."""
    results = args.results if args.results is not None else args.root / RESULTS
    for path, (old, new) in generate(args.root, results).items():
        if old == new:
            continue
        if args.check:
            print(f"{path}: results tables differ from {results}/*.json; run python scripts/results_table.py")
            return 1
        path.write_text(new)
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))
