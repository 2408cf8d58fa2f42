"""Reliability checks of issue 31, one results row each: ``{check, cases, passed, lost}``.

Run: ``python benchmarks/reliability.py`` (``--checks bad_input``). Checks:

- ``bad_input``: the bad-input table of tests/test_bad_input.py over ALL its generated cases (the test samples
  them): every flag of every command fed a wrong type, an out-of-range number, an empty value or a missing path
  must fail with exit status 2, one ``dmrl: error:`` line (at most 3 lines), no traceback and no file created or
  changed. One row per command (``bad_input/<command>``; train's policy / algorithm / source types included).
  ``lost`` is 0 by construction here (no data is written); fault-injection checks report lost transitions.
- ``fault_injection``: one online ``dmrl train`` run (tiny diffusion-ql, 2 collectors, an evaluator, a state every
  ``--fi-save-every`` updates) that is hit, every few seconds, by a random SIGKILL of a collector, the evaluator or
  the whole learner; after a learner kill the test checks that no child outlives it and resumes with ``--resume``.
  Rows: ``fault_injection/<target>`` with cases = kills, passed = kills survived (a child: its restart logged and
  the learner alive; the learner: no orphan, resumed with the replay of its last state), lost = transitions of the
  saved replay missing after the resume; ``fault_injection/run``: the run completed with all its updates.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from _common import RESULTS, machine, parse_args, write_results

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("bad_input", "fault_injection")


@dataclass
class Args:
    checks: list[str] = field(default_factory=lambda: ["bad_input"])
    """Checks to run: bad_input, fault_injection."""
    fi_kills: int = 12
    """fault_injection: kills to inject (then the run is left to finish)."""
    fi_steps: int = 3000
    """fault_injection: updates of the run."""
    fi_save_every: int = 25
    """fault_injection: updates between training states."""
    fi_seed: int = 0
    """fault_injection: seed of the kill schedule."""
    name: str = "reliability"
    """Results file name under benchmarks/results/."""


def _table_module():
    if str(ROOT / "tests") not in sys.path:  # its synthetic store helper (tests/state_store.py)
        sys.path.insert(0, str(ROOT / "tests"))
    spec = importlib.util.spec_from_file_location("test_bad_input", ROOT / "tests" / "test_bad_input.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def bad_input() -> list[dict]:
    t = _table_module()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = t.make_store(Path(tmp) / "store" / "data.zarr")
        for case in t.controls(store):  # the base argv of every command must be accepted, else nothing is proven
            work = Path(tmp) / "control" / case.command
            t.prepare_workdir(work)
            outcome = t.run_case(case, work, ())
            if outcome.code != (0 if case.command == "info" else None):
                raise SystemExit(f"control {case.argv} was refused: {outcome.stderr.strip()}")
        by_command: dict[str, list] = defaultdict(list)
        for i, case in enumerate(t.all_cases(store)):
            work = Path(tmp) / "work" / str(i)
            t.prepare_workdir(work)
            by_command[case.command].append((case, t.run_case(case, work, (store, t.CHECKPOINT))))
    for command, results in by_command.items():
        failed = [(c, o) for c, o in results if o.problems()]
        for c, o in failed:
            print(f"FAIL {c.id}: {'; '.join(o.problems())}\n    {o.stderr.strip()[-300:]}")
        lines = Counter(len(o.stderr.strip().splitlines()) for _, o in results)
        rows.append(
            {
                "check": f"bad_input/{command}",
                "cases": len(results),
                "passed": len(results) - len(failed),
                "lost": 0,
                "flags": len({c.flag for c, _ in results}),
                "one_line": lines.get(1, 0),
                "max_case_s": round(max(o.seconds for _, o in results), 3),
            }
        )
    return rows


def _proc_children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z" and b"resource_tracker" not in cmd:
                out.append(int(entry))
    return out


def _children_file(run: Path, learner: int) -> dict | None:
    """The run's children.json ({"learner", "collectors", "evaluator"} pids) as the learner ``learner`` wrote it;
    None while it is missing or unreadable, or left behind by an earlier (killed) learner."""
    try:
        kids = json.loads((run / "children.json").read_text())
    except (OSError, ValueError):
        return None
    return kids if isinstance(kids, dict) and kids.get("learner") == learner else None


def _proc_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def fault_injection(args: Args) -> list[dict]:
    """Random SIGKILLs of collectors, the evaluator and the learner in one online run (see the module doc)."""
    sys.path.insert(0, str(ROOT / "src"))
    from dmrl.train.engine.state import state_dirs

    rnd = random.Random(args.fi_seed)
    stats = {t: {"cases": 0, "passed": 0, "lost": 0} for t in ("collector", "evaluator", "learner")}
    tiny = {
        "batch_size": 8,
        "chunk": {"horizon": 8, "n_action_steps": 4, "encoder": {"width": 32}},
        "policy": {"type": "diffusion", "num_train_steps": 20, "num_inference_steps": 3,
                   "denoiser_kwargs": {"hidden_dim": 32}},
        "algo": {"type": "diffusion-ql", "critic": {"hidden": 32, "depth": 2}},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        data, run, preset = Path(tmp) / "d.zarr", Path(tmp) / "run", Path(tmp) / "tiny.json"
        dmrl = [sys.executable, "-m", "dmrl"]
        subprocess.run([*dmrl, "collect", "--out", str(data), "--episodes", "2", "--workers", "0", "--obs-modes",
                        "state"], check=True, capture_output=True)  # fmt: skip
        preset.write_text(json.dumps(tiny))  # YAML is a superset of JSON
        argv = [*dmrl, "train", "--config", str(preset), "--source.type", "online", "--source.learning-starts", "4",
                "--source.max-episode-steps", "24", "--source.publish-every", "2", "--source.eval-every", "5",
                "--source.eval-episodes", "1", "--engine.save-every", str(args.fi_save_every), "--dataset",
                str(data), "--out", str(run), "--steps", str(args.fi_steps)]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        expect_restore: dict | None = None
        kills = 0
        while kills < args.fi_kills and proc.poll() is None:
            time.sleep(rnd.uniform(2.0, 6.0))
            if proc.poll() is not None:
                break
            if expect_restore is not None:  # the resumed run's first records: the replay it restored
                rec = next((x for x in _metrics(run) if "replay_restored" in x and x["step"] == expect_restore["step"]),
                           None)  # fmt: skip
                if rec is None:
                    continue
                lost = max(0, expect_restore["replay_written"] - rec["replay_written"])
                stats["learner"]["lost"] += lost
                stats["learner"]["passed"] += int(lost == 0 and rec["replay_restored"] == expect_restore["replay_size"])
                expect_restore = None
            target = rnd.choice(["collector", "evaluator", "learner"])
            kids = _proc_children(proc.pid)
            if target != "learner":  # the learner names its children; the restart record confirms which died
                named = _children_file(run, proc.pid)
                if named is None:
                    continue
                pool = named["collectors"] if target == "collector" else [named["evaluator"]]
                pool = [k for k in pool if k is not None and _proc_alive(k)]
                if not pool:
                    continue
                before = len(_metrics(run))
                os.kill(rnd.choice(pool), signal.SIGKILL)
                kills += 1
                deadline, seen = time.monotonic() + 30, None
                while seen is None and time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.3)
                    new = _metrics(run)[before:]
                    seen = next((t for x in new for t in ("collector", "evaluator") if f"{t}_restart" in x), None)
                target = seen or target
                stats[target]["cases"] += 1
                stats[target]["passed"] += int(seen is not None and proc.poll() is None)
                continue
            if not state_dirs(run):
                continue
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            stats["learner"]["cases"] += 1
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and any(_proc_alive(k) for k in kids):
                time.sleep(0.2)
            if any(_proc_alive(k) for k in kids):
                print(f"FAIL learner kill {kills}: orphaned children {[k for k in kids if _proc_alive(k)]}")
                stats["learner"]["passed"] -= 1  # counted as failed even if the resume then matches
            last = state_dirs(run)[-1]
            saved = json.loads((last / "online.json").read_text())
            expect_restore = {"step": int(last.name.split("_")[1]), **saved}
            proc = subprocess.Popen([*argv, "--resume"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, err = proc.communicate(timeout=1800)
        if expect_restore is not None:
            rec = next((x for x in _metrics(run) if "replay_restored" in x and x["step"] == expect_restore["step"]), {})
            lost = max(0, expect_restore["replay_written"] - rec.get("replay_written", 0))
            stats["learner"]["lost"] += lost
            stats["learner"]["passed"] += int(lost == 0 and rec.get("replay_restored") == expect_restore["replay_size"])
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
        done = proc.returncode == 0 and summary.get("train_steps") == args.fi_steps
        if not done:
            print(f"FAIL fault_injection run: exit {proc.returncode}\n{err[-2000:]}")
    rows = [{"check": f"fault_injection/{t}", **v} for t, v in stats.items()]
    rows.append({"check": "fault_injection/run", "cases": 1, "passed": int(done),
                 "lost": sum(v["lost"] for v in stats.values()), "kills": kills})  # fmt: skip
    return rows


def main() -> None:
    args = parse_args(Args, __doc__)
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        raise SystemExit(f"--checks: got {unknown[0]!r}; allowed: {', '.join(CHECKS)}")
    t0 = time.perf_counter()
    rows: list[dict] = []
    if "bad_input" in args.checks:
        rows += bad_input()
    if "fault_injection" in args.checks:
        rows += fault_injection(args)
    meta = {
        **machine(),
        "command": "python benchmarks/reliability.py " + " ".join(sys.argv[1:]),
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "bad_input": "cases = generated (flag, bad value) pairs of tests/test_bad_input.py, all of them; "
        "passed = exit 2, no traceback, <= 3 stderr lines with a 'dmrl: error:' line, nothing created or changed; "
        "one_line = cases with exactly one stderr line; flags = flags covered",
        "fault_injection": "cases = SIGKILLs of that target; passed = survived (child: restart logged, learner alive; "
        "learner: no orphan, resumed with its last state's replay); lost = replay transitions of the last state "
        "missing after a resume; run: the run finished with all its updates",
    }
    # Rows of checks not run now are kept (each check owns the rows named "<check>/...").
    previous = RESULTS / f"{args.name}.json"
    if previous.is_file():
        kept = [r for r in json.loads(previous.read_text())["results"] if r["check"].split("/")[0] not in args.checks]
        rows = kept + rows
    write_results(args.name, rows, meta, ["check", "cases", "passed", "lost", "flags", "one_line", "max_case_s"])
    if any(r["passed"] != r["cases"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
