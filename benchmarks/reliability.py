"""Reliability checks of issue 31, one results row each: ``{check, cases, passed, lost}``.

Run: ``python benchmarks/reliability.py`` (``--checks bad_input``). Checks:

- ``bad_input``: the bad-input table of tests/test_bad_input.py over ALL its generated cases (the test samples
  them): every flag of every command fed a wrong type, an out-of-range number, an empty value or a missing path
  must fail with exit status 2, one ``dmrl: error:`` line (at most 3 lines), no traceback and no file created or
  changed. One row per command (``bad_input/<command>``; train's policy / algorithm / source types included).
  ``lost`` is 0 by construction here (no data is written); fault-injection checks report lost transitions.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from _common import RESULTS, machine, parse_args, write_results

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("bad_input",)


@dataclass
class Args:
    checks: list[str] = field(default_factory=lambda: ["bad_input"])
    """Checks to run: bad_input (fault-injection checks join here)."""
    name: str = "reliability"
    """Results file name under benchmarks/results/."""


def _table_module():
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


def main() -> None:
    args = parse_args(Args, __doc__)
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        raise SystemExit(f"--checks: got {unknown[0]!r}; allowed: {', '.join(CHECKS)}")
    t0 = time.perf_counter()
    rows: list[dict] = []
    if "bad_input" in args.checks:
        rows += bad_input()
    meta = {
        **machine(),
        "command": "python benchmarks/reliability.py " + " ".join(sys.argv[1:]),
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "bad_input": "cases = generated (flag, bad value) pairs of tests/test_bad_input.py, all of them; "
        "passed = exit 2, no traceback, <= 3 stderr lines with a 'dmrl: error:' line, nothing created or changed; "
        "one_line = cases with exactly one stderr line; flags = flags covered",
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
