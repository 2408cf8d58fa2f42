"""Meta-World 3.1.1's scripted policies under MuJoCo 4 (dmrl's shim) and, for reference, under the MuJoCo 3.3.0
its wheel pins: success over fixed seeds per task, fresh seeded layout per episode (as metaworld/<task>-v3 resets).

Run: ``python benchmarks/metaworld_experts.py`` (this venv's MuJoCo) and, to add the MuJoCo 3.3 column, an
interpreter with ``mujoco==3.3.0 metaworld==3.1.1`` (no dmrl needed there), e.g.
``python3 -m venv /tmp/mw33 && /tmp/mw33/bin/pip install mujoco==3.3.0 metaworld==3.1.1 scipy gymnasium imageio
packaging`` then ``python benchmarks/metaworld_experts.py --reference-python /tmp/mw33/bin/python``.
Each interpreter runs this file with ``--worker`` (Meta-World, MuJoCo and numpy only: the shim is loaded from its
file, and applied only where the weld row does not fit).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

COMPAT = Path(__file__).resolve().parents[1] / "src" / "dmrl" / "envs" / "suites" / "metaworld_compat.py"


@dataclass
class Args:
    seeds: int = 20
    """Episodes per task (seeds 0 .. seeds-1)."""
    max_steps: int = 500
    """Meta-World's own episode limit; success within 200 steps (the BC protocol's episodes) is counted too."""
    reference_python: str = ""
    """An interpreter with mujoco 3.3.0 + metaworld 3.1.1 for the reference column; empty: none."""
    worker: bool = False
    """Internal: measure with this interpreter and print JSON rows."""


def measure(seeds: int, max_steps: int) -> dict:
    """{mujoco version, shim applied, rows: task, success_200, success_500, mean_first_success_step}."""
    import mujoco

    spec = importlib.util.spec_from_file_location("metaworld_compat", COMPAT)
    compat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compat)
    shim = compat.apply_shim()
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS
    from metaworld.policies import ENV_POLICY_MAP

    warnings.filterwarnings("ignore")
    rows = []
    for name, cls in ALL_V3_ENVIRONMENTS.items():
        env = cls()
        # What MetaWorldEnv does: goal observable, a fresh layout per reset from the env's seeded generator.
        env._partially_observable = False
        del env.sawyer_observation_space
        env._set_task_called, env._freeze_rand_vec, env.seeded_rand_vec = True, False, True
        env.max_path_length = max_steps
        policy = ENV_POLICY_MAP[name]()
        firsts = []
        for seed in range(seeds):
            env.seed(seed)
            obs, _ = env.reset()
            first = None
            for t in range(max_steps):
                obs, _, _, truncated, info = env.step(policy.get_action(obs))
                if info["success"]:
                    first = t + 1
                    break
                if truncated:
                    break
            firsts.append(first)
        ok = [f for f in firsts if f is not None]
        rows.append(
            {
                "task": name,
                "success_200": sum(f <= 200 for f in ok) / seeds,
                f"success_{max_steps}": len(ok) / seeds,
                "mean_first_success_step": sum(ok) / len(ok) if ok else float("nan"),
            }
        )
        env.close()
    return {"mujoco": mujoco.__version__, "shim": bool(shim), "rows": rows}


def main() -> None:
    from _common import machine, parse_args, write_results

    args = parse_args(Args, __doc__)
    runs = {}
    for label, python in (("mujoco4", sys.executable), ("mujoco33", args.reference_python)):
        if not python:
            continue
        cmd = [python, __file__, "--worker", "--seeds", str(args.seeds), "--max-steps", str(args.max_steps)]
        t = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        runs[label] = json.loads(out.strip().splitlines()[-1]) | {"seconds": round(time.perf_counter() - t, 1)}
    here = runs["mujoco4"]
    ref = {r["task"]: r for r in runs.get("mujoco33", {}).get("rows", [])}
    rows = []
    for r in here["rows"]:
        row = {
            "task": r["task"],
            "success_200": r["success_200"],
            f"success_{args.max_steps}": r[f"success_{args.max_steps}"],
        }
        if r["task"] in ref:
            row["success_200_mujoco33"] = ref[r["task"]]["success_200"]
            row[f"success_{args.max_steps}_mujoco33"] = ref[r["task"]][f"success_{args.max_steps}"]
        rows.append(row)
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0] if k != "task"}
    rows.append({"task": "MEAN", **mean})
    meta = {
        **machine(),
        "command": " ".join(["python", "benchmarks/metaworld_experts.py", *sys.argv[1:]]),
        "seeds": args.seeds,
        "max_steps": args.max_steps,
        "runs": {k: {"mujoco": v["mujoco"], "shim": v["shim"], "seconds": v["seconds"]} for k, v in runs.items()},
        "note": "scripted policies of metaworld.policies; seeds 0..n-1 reseed the layout generator (env.seed)",
    }
    write_results("metaworld_experts", rows, meta, list(rows[0]))


if __name__ == "__main__":
    if "--worker" in sys.argv:
        argv = sys.argv[1:]
        seeds = int(argv[argv.index("--seeds") + 1])
        max_steps = int(argv[argv.index("--max-steps") + 1])
        print(json.dumps(measure(seeds, max_steps)))
    else:
        main()
