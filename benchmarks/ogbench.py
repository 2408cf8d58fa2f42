"""OGBench offline RL (issue 28 §4): dmrl's QC, FQL and IDQL on OGBench's manipulation datasets, learning curves
compared point by point with published ones, run across sessions in budgeted segments.

Protocol (module constants): a `play` dataset generated locally with OGBench 1.2.2's oracles (``dmrl collect``,
reset seeds 0.., 1001-step episodes; the published files hold 1000 episodes = 1M transitions, ``--data-episodes``
sets how many here and is part of the run's name), state observations, chunks of 5 actions (To 1, Tp = Ta = 5: the
chunk length of Q-chunking, Li, Zhou & Levine 2025), batch 256, the actor of configs/rl_offline.yaml (diffusion,
256x2 MLP denoiser, x0 prediction, 10 DDIM steps) and dmrl's defaults for everything else, FQL with alpha 300 (the
FQL repository's value for these three envs). TD terminals as OGBench's single-task datasets mark them (``masks``
0 where the task holds before the action): the store keeps them per step and a chunk ends at its first one (no
reward or bootstrap after it), as the evaluation env ends its episode there. Evaluation: OGBench's single-task env
(success = the env's ``success``), a curve point of ``--curve-episodes`` episodes (reset seeds 100000..) every
``--curve-every`` updates. Runs and datasets from before the terminals (names without ``term``) stay as they are
and are marked ``td_terminals`` false in the table.

A run (env, task, method, seed, dataset size) trains towards ``--updates`` (default 1M, the published offline
budget) in segments of about ``--minutes`` each: a segment stops at the first curve point after its budget (SIGINT
through dmrl's state-saving path) and ``--runs`` again resumes it from that state. After every segment the run's
JSON in benchmarks/results/ogbench_runs/ holds the curve so far, the updates done, update rate, minutes, load and
commit; ``--aggregate`` writes benchmarks/results/ogbench.json / .md from them, every curve point beside the
published number at the same update count where one is known.

    nice -n 19 python benchmarks/ogbench.py --runs scene:2:qc:0 --data-episodes 100 --minutes 40
    python benchmarks/ogbench.py --status
    python benchmarks/ogbench.py --aggregate
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from _common import RESULTS, machine, parse_args  # noqa: E402

# This file is named ogbench.py (the name): with benchmarks/ on sys.path, `import ogbench` in the env
# adapter would find this script instead of the OGBench package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

ROOT = HERE.parent
RUNS = RESULTS / "ogbench_runs"
OUT = ROOT / "outputs" / "ogbench"

ENVS = ("cube-single", "cube-double", "scene")
TASKS = (1, 2, 3, 4, 5)
#: method -> its --algo.* flags (dmrl's defaults otherwise; docs/rl.md).
METHODS: dict[str, list[str]] = {
    "qc": ["--algo.type", "qc"],  # BC proposal, best-of-32 by the critic, max over 8 proposal samples in the backup
    "fql": ["--algo.type", "fql", "--algo.alpha", "300"],  # alpha: the FQL repository's README for these envs
    "idql": ["--algo.type", "idql"],  # BC proposal, best-of-32, expectile value
}
PUBLISHED_DATA_EPISODES = 1000
CHUNK = ["--chunk.obs-keys", "state", "--chunk.n-obs-steps", "1", "--chunk.horizon", "5", "--chunk.n-action-steps", "5"]
ACTOR = ["--policy.type", "diffusion", "--policy.denoiser", "mlp", "--policy.denoiser-kwargs", "hidden_dim", "256"]
ACTOR += ["n_blocks", "2", "--policy.prediction-type", "sample", "--policy.num-inference-steps", "10"]
BATCH = 256
EVAL_SEED = 100_000

#: Published success (0-1) at a number of offline updates: {(env, task, method, updates): (value, source)}, exactly
#: as issue 28 quotes them (the released curves of Li, Zhou & Levine 2025, evaluated every 100k updates).
PUBLISHED_CURVE: dict[tuple[str, int, str, int], tuple[float, str]] = {
    ("scene", 2, "qc", 100_000): (0.97, "Li, Zhou & Levine 2025 (Q-chunking), released curve, as issue 28 quotes"),
    ("cube-double", 2, "qc", 300_000): (
        0.31,
        "Li, Zhou & Levine 2025 (Q-chunking), released curve, as issue 28 quotes",
    ),
}
#: Published final numbers (%, 1M offline updates, 8 seeds, 50 evaluation episodes), as issue 28 quotes them.
PUBLISHED_FINAL = {
    "source": "Park et al. 2025 (FQL) Table, as issue 28 quotes it: 1M offline gradient steps, 8 seeds, "
    "50 evaluation episodes",
    "cube-single": {"fql": "96 ± 1", "idql": "95", "rebrac": "91", "iql": "83"},
    "cube-double": {"fql": "29 ± 2", "idql": "15", "rebrac": "12", "iql": "7"},
    "scene": {"fql": "56 ± 2", "idql": "46", "rebrac": "41", "iql": "28"},
    "q_chunking": "Li, Zhou & Levine 2025, 1M offline -> +1M online, chunk length 5: cube-double QC 67 -> 98, "
    "QC-FQL 39 -> 100, FQL 28 -> 76; scene-sparse QC 84 -> 99",
}
DATA_NOTE = (
    "datasets are regenerated here with OGBench 1.2.2's own play oracles (dmrl collect; the published protocol's "
    "episode length, noise and target sampling), not the published .npz files; data_episodes says how many 1001-step "
    "episodes (published: 1000, i.e. 1M transitions). TD terminal at every step where the task holds (OGBench's "
    "masks; td_terminals false: a run from before dmrl kept them, which bootstrapped through success states). "
    "Published protocol: 1M offline updates, 8 seeds, 50 evaluation episodes; ours: the updates, seeds and episodes of "
    "each row, on 2 shared CPU cores under nice 19"
)


def run_name(env: str, task: int, method: str, seed: int, data_episodes: int, terminals: bool = True) -> str:
    """The run's file stem in benchmarks/results/ogbench_runs/ (and its directory in outputs/ogbench/runs/);
    ``terminals`` False: the name of a run from before TD terminals (its record lacks ``terminals``)."""
    return f"{env}-task{task}__{method}__seed{seed}__data{data_episodes}ep" + ("__term" if terminals else "")


def record_name(r: dict) -> str:
    """run_name of a run record, old ones included."""
    return run_name(r["env"], r["task"], r["method"], r["seed"], r["data_episodes"], r.get("terminals", False))


def parse_run(spec: str) -> tuple[str, int, str, int]:
    """``env:task:method:seed`` -> (env, task, method, seed); a one-line ValueError for anything else."""
    parts = spec.split(":")
    ok = len(parts) == 4 and parts[1].isdigit() and parts[3].isdigit()
    if not ok or parts[0] not in ENVS or int(parts[1]) not in TASKS or parts[2] not in METHODS:
        raise ValueError(
            f"--runs: got {spec!r}; expected env:task:method:seed with env in {', '.join(ENVS)}, task 1-5, method "
            f"in {', '.join(METHODS)}, e.g. scene:2:qc:0"
        )
    return parts[0], int(parts[1]), parts[2], int(parts[3])


def published(env: str, task: int, method: str, updates: int) -> float | None:
    """The published success of ``method`` at ``updates`` offline updates, None where none is known."""
    hit = PUBLISHED_CURVE.get((env, task, method, updates))
    return None if hit is None else hit[0]


def _atomic_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _cpu_seconds() -> float:
    return sum(
        r.ru_utime + r.ru_stime
        for r in (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def dataset(env: str, task: int, episodes: int, runs_dir: Path = RUNS, out: Path = OUT) -> Path:
    """The task's play store with ``episodes`` episodes (generated once, timed into data__<name>.json)."""
    import numpy as np

    from dmrl.cli import main as dmrl
    from dmrl.data.episodes import EpisodeStore

    name = f"{env}-task{task}_{episodes}ep_term"  # _term: with per-step TD terminals (older stores lack them)
    path = out / "data" / f"{name}.zarr"
    if (path / ".done").exists():
        return path
    argv = ["collect", "--env", f"ogbench/{env}-play-singletask-task{task}-v0", "--episodes", str(episodes)]
    workers = "2" if episodes > 1 else "0"  # one episode: in this process, no worker start-up
    argv += ["--seed", "0", "--obs-modes", "state", "--out", str(path), "--workers", workers, "--overwrite"]
    cpu0, t0, load0 = _cpu_seconds(), time.perf_counter(), os.getloadavg()[0]
    if dmrl(argv) != 0:
        raise SystemExit(f"dmrl {' '.join(argv)} failed")
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    store = EpisodeStore.open(path)
    if not store.has_terminals:
        raise SystemExit(f"{path}: dmrl collect kept no per-step terminals; OGBench's env should report them")
    steps = int(store.n_steps)
    record = {
        "env": env,
        "task": task,
        "episodes": episodes,
        "steps": steps,
        "minutes": round(wall / 60, 2),
        "cpu_minutes": round(cpu / 60, 2),
        "steps_per_s": round(steps / wall, 1),
        "steps_per_cpu_s": round(steps / cpu, 1),
        "task_success_share": round(float(store.success.mean()), 3),
        "terminals": True,
        "terminal_step_share": round(float(np.asarray(store.array("terminals")[:steps]).mean()), 5),
        "load_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "nice": os.nice(0),
        "machine": machine(),
        "dmrl_argv": ["dmrl", *argv],
        "command": " ".join(["python", "benchmarks/ogbench.py", *sys.argv[1:]]),
    }
    _atomic_json(runs_dir / f"data__{name}.json", record)
    (path / ".done").write_text("")
    print(f"{name}: {steps} steps in {record['minutes']} min ({record['steps_per_s']} steps/s)", flush=True)
    return path


def train_argv(data: Path, out: Path, method: str, seed: int, a: Args) -> list[str]:
    argv = ["train", "--dataset", str(data), "--out", str(out), "--overwrite", "--seed", str(seed)]
    argv += ["--steps", str(a.updates), "--batch-size", str(BATCH), *CHUNK, *ACTOR, *METHODS[method]]
    argv += ["--source.val-fraction", "0", "--source.curve-every", str(a.curve_every)]
    argv += ["--source.curve-episodes", str(a.curve_episodes), "--eval-seed", str(EVAL_SEED), "--eval-envs", "4"]
    # A training state at every curve point: a segment stops right after one (Stopper) and resumes there.
    return argv + ["--engine.save-every", str(a.curve_every), "--engine.cpu-threads", "1"]


class Stopper:
    """Samples the load every 30 s; once ``minutes`` have passed, sends this process SIGINT right after the next
    curve point appears in ``metrics`` (or ``grace`` minutes later at the latest): dmrl then saves a state and the
    segment ends on a curve point, so nothing evaluated is lost."""

    POLL = 2.0  # seconds between looks at metrics.jsonl
    SETTLE = 3.0  # seconds between a new point and the interrupt: dmrl saves the point's state first

    def __init__(self, metrics: Path, minutes: float, grace: float) -> None:
        self.metrics, self.deadline, self.grace = metrics, time.time() + 60 * minutes, 60 * grace
        self.load: list[float] = []
        self.stopped = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _points(self) -> int:
        try:
            return self.metrics.read_text().count("curve_success")
        except OSError:
            return 0

    def _loop(self) -> None:
        last_load, seen = 0.0, None
        while not self._done.wait(self.POLL):
            now = time.time()
            if now - last_load >= 30:
                self.load.append(os.getloadavg()[0])
                last_load = now
            if now < self.deadline:
                continue
            seen = self._points() if seen is None else seen
            if self._points() > seen or now > self.deadline + self.grace:
                if self._done.wait(self.SETTLE):  # the run ended meanwhile
                    return
                self.stopped = True
                os.kill(os.getpid(), signal.SIGINT)
                return

    def __enter__(self) -> Stopper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


def read_points(metrics: Path) -> list[dict]:
    """Curve points of a run's metrics.jsonl: [{updates, success_rate, ci_low, ci_high}, ...]."""
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.is_file() else []
    return [
        {
            "updates": m["step"],
            "success_rate": m["curve_success"],
            "ci_low": m["curve_ci_low"],
            "ci_high": m["curve_ci_high"],
        }
        for m in lines
        if "curve_success" in m
    ]


def logged_steps(metrics: Path) -> list[int]:
    """Every step a run's metrics.jsonl logged (a resumed run has dropped those after its last saved state)."""
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    return [json.loads(x)["step"] for x in lines if x.strip()]


def update_rate(metrics: Path, since: int) -> float | None:
    """Training updates/s of the segment that started at update ``since`` (dmrl logs samples/s without the curve
    evaluations); None when it logged none."""
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.is_file() else []
    rates = [m["samples_per_s"] for m in lines if "samples_per_s" in m and m["step"] > since]
    return round(rates[-1] / BATCH, 3) if rates else None


def merge_curve(old: list[dict], new: list[dict], episodes: int) -> list[dict]:
    """The run's curve: its earlier points, then the new ones (each with the episodes it was evaluated on)."""
    have = {p["updates"] for p in old}
    return old + [p | {"episodes": episodes} for p in new if p["updates"] not in have]


def run_segment(env: str, task: int, method: str, seed: int, a: Args, runs_dir: Path = RUNS, out: Path = OUT) -> Path:
    """Train one run for about ``a.minutes`` (resuming its state if it has one) and write its JSON."""
    from dmrl.cli import main as dmrl

    data = dataset(env, task, a.data_episodes, runs_dir, out)
    name = run_name(env, task, method, seed, a.data_episodes)
    run_dir, path = out / "runs" / name, runs_dir / f"{name}.json"
    old = json.loads(path.read_text()) if path.is_file() else None
    argv = train_argv(data, run_dir, method, seed, a)
    state = run_dir / "state"
    if (run_dir / "config.json").is_file() and state.is_dir() and any(state.iterdir()):
        argv[argv.index("--overwrite")] = "--resume"
    elif old is not None:
        print(f"{name}: no training state in {run_dir} (another machine?): starting again", flush=True)
        old = None
    since = old["updates_done"] if old else 0
    started, cpu0, t0 = machine(), _cpu_seconds(), time.perf_counter()
    stop, code = Stopper(run_dir / "metrics.jsonl", a.minutes, grace=max(5.0, a.minutes / 2)), None
    try:
        with stop:
            code = dmrl(argv)  # dmrl turns the Stopper's SIGINT into a saved state and exit 130
    except KeyboardInterrupt:  # the SIGINT landed outside dmrl's loop (while it started or finished)
        if not stop.stopped:
            raise
        code = 130 if code is None else code
    if code not in (0, 130):
        raise SystemExit(f"dmrl {' '.join(argv)} failed (exit {code})")
    if code == 130 and not stop.stopped:
        raise KeyboardInterrupt  # a Ctrl-C from outside: the state is saved, nothing recorded
    points = read_points(run_dir / "metrics.jsonl")
    curve = merge_curve(old["curve"] if old else [], points, a.curve_episodes)
    done = max([since, *logged_steps(run_dir / "metrics.jsonl")])
    seg = {
        "updates": [since, done],
        "minutes": round((time.perf_counter() - t0) / 60, 2),
        "cpu_minutes": round((_cpu_seconds() - cpu0) / 60, 2),
        "updates_per_s": update_rate(run_dir / "metrics.jsonl", since),
        "load_mean": round(sum(stop.load) / max(len(stop.load), 1), 2),
        "nice": os.nice(0),
        "commit": started["git_commit"],
        "command": " ".join(["python", "benchmarks/ogbench.py", *sys.argv[1:]]),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    record = {
        "env": env,
        "task": task,
        "method": method,
        "seed": seed,
        "data_episodes": a.data_episodes,
        "terminals": True,
        "updates_target": a.updates,
        "updates_done": done,
        "complete": done >= a.updates,
        "curve": curve,
        "segments": [*(old["segments"] if old else []), seg],
        "machine": started,
        "dmrl_argv": ["dmrl", *argv],
    }
    _atomic_json(path, record)
    last = curve[-1] if curve else None
    print(f"wrote {path}: {done} updates, last point {last}, {seg['minutes']} min", flush=True)
    return path


def aggregate_rows(records: list[dict]) -> list[dict]:
    """One row per curve point of every run (sorted by env, task, method, seed, updates)."""
    rows = []
    for r in sorted(records, key=lambda r: (ENVS.index(r["env"]), r["task"], r["method"], r["seed"])):
        for p in r["curve"]:
            rows.append(
                {
                    "dataset": f"{r['env']}-play-singletask-task{r['task']}",
                    "method": r["method"],
                    "seed": r["seed"],
                    "updates": p["updates"],
                    "success_rate": p["success_rate"],
                    "ci_low": p["ci_low"],
                    "ci_high": p["ci_high"],
                    "episodes": p["episodes"],
                    "published_qc": published(r["env"], r["task"], "qc", p["updates"]),
                    "published_fql": published(r["env"], r["task"], "fql", p["updates"]),
                    "data_episodes": r["data_episodes"],
                    "run_complete": f"{r['updates_done']}/{r['updates_target']}",
                    "td_terminals": bool(r.get("terminals", False)),
                }
            )
    return rows


def read_records(runs_dir: Path) -> tuple[list[dict], list[dict]]:
    """(run records, data-generation records) in ``runs_dir``."""
    files = sorted(runs_dir.glob("*.json")) if runs_dir.is_dir() else []
    runs = [json.loads(f.read_text()) for f in files if not f.name.startswith("data__")]
    return runs, [json.loads(f.read_text()) for f in files if f.name.startswith("data__")]


def _cell(v) -> str:
    return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def markdown(rows: list[dict], runs: list[dict], data: list[dict], meta: dict) -> str:
    cols = list(rows[0]) if rows else ["dataset", "method", "updates", "success_rate"]
    table = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    table += "".join("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |\n" for r in rows)
    speed = "| run | updates done / target | segments | minutes | updates/s (last segment) | load |\n"
    speed += "|---|---|---|---|---|---|\n"
    for r in runs:
        segs = r["segments"]
        name = record_name(r)
        speed += f"| {name} | {r['updates_done']} / {r['updates_target']} | {len(segs)} | "
        speed += (
            f"{sum(s['minutes'] for s in segs):.1f} | {_cell(segs[-1]['updates_per_s'])} | {segs[-1]['load_mean']} |\n"
        )
    gen = "| data | steps | minutes | steps/s | steps per CPU-s | task success share | terminal steps |\n"
    gen += "|---|---|---|---|---|---|---|\n" + "".join(
        f"| {d['env']}-task{d['task']} {d['episodes']} ep | {d['steps']} | {d['minutes']} | {d['steps_per_s']} | "
        f"{d['steps_per_cpu_s']} | {d['task_success_share']} | {_cell(d.get('terminal_step_share'))} |\n"
        for d in data
    )
    bullets = "".join(f"- {k}: {v}\n" for k, v in meta.items())
    return (
        "# ogbench\n\n**Datasets regenerated locally from the same oracles, not the published files.** "
        f"{DATA_NOTE}.\n\n"
        f"{table}\nRuns:\n\n{speed}\nData generation:\n\n{gen}\n{bullets}"
    )


def aggregate(runs_dir: Path = RUNS, results: Path = RESULTS) -> list[dict]:
    """benchmarks/results/ogbench.json / .md from the run JSONs."""
    runs, data = read_records(runs_dir)
    rows = aggregate_rows(runs)
    meta = {
        **machine(),
        "command": "python benchmarks/ogbench.py --aggregate",
        "datasets": DATA_NOTE,
        "protocol": f"To 1, Tp = Ta = 5, batch {BATCH}, actor {' '.join(ACTOR)}; methods "
        + "; ".join(f"{k}: {' '.join(v)}" for k, v in METHODS.items()),
        "published_curve": {f"{e}-task{t} {m} @ {u}": f"{v} ({s})" for (e, t, m, u), (v, s) in PUBLISHED_CURVE.items()},
        "published_final": PUBLISHED_FINAL,
        "rows": "one per curve point of every run; success over `episodes` evaluation episodes (reset seeds 100000..), "
        "95% Wilson interval; published_* is the published success at the same number of updates, – where none is "
        "known; run_complete: updates done / target (a run short of its target is partial); td_terminals: the run's "
        "data had OGBench's per-step terminals (false: a run from before them)",
        "runs": {record_name(r): r["segments"] for r in runs},
        "data_generation": data,
    }
    results.mkdir(parents=True, exist_ok=True)
    _atomic_json(results / "ogbench.json", {"meta": meta, "results": rows})
    text = markdown(
        rows,
        runs,
        data,
        {
            k: meta[k]
            for k in ("cpu", "git_commit", "date", "command", "protocol", "published_curve", "published_final")
        },
    )
    (results / "ogbench.md.tmp").write_text(text)
    os.replace(results / "ogbench.md.tmp", results / "ogbench.md")
    print(text)
    return rows


@dataclass
class Args:
    runs: list[str] = field(default_factory=list)
    """Runs to start or continue, env:task:method:seed (e.g. scene:2:qc:0), one segment each."""
    data_episodes: int = PUBLISHED_DATA_EPISODES
    """Play episodes (1001 steps each) of the generated dataset (published: 1000); part of the run's name."""
    updates: int = 1_000_000
    """Offline updates a run trains towards (the published budget); fixed for a run once started."""
    minutes: float = 60.0
    """Wall minutes of one segment: it stops at the first curve point after them."""
    curve_every: int = 5000
    """Updates between curve points (a divisor of 100000, so points meet the published ones)."""
    curve_episodes: int = 50
    """Evaluation episodes per curve point (published: 50)."""
    aggregate: bool = False
    """Write benchmarks/results/ogbench.json / .md from the run JSONs (after any runs asked for)."""
    status: bool = False
    """Print each run's updates done and last curve point, and exit."""

    def __post_init__(self) -> None:
        if self.curve_every < 1 or 100_000 % self.curve_every:
            raise ValueError(f"--curve-every: got {self.curve_every}; need a divisor of 100000 (e.g. 1000, 5000)")
        if self.data_episodes < 1 or self.updates < 1 or self.minutes <= 0 or self.curve_episodes < 1:
            raise ValueError(
                "--data-episodes, --updates, --curve-episodes >= 1 and --minutes > 0 needed; got "
                f"{self.data_episodes}, {self.updates}, {self.curve_episodes}, {self.minutes}"
            )


def main(argv: list[str] | None = None) -> None:
    try:
        a = parse_args(Args, __doc__, argv, allow_empty=("runs",))
        specs = [parse_run(s) for s in a.runs]
    except ValueError as e:
        print(e, file=sys.stderr)
        raise SystemExit(2) from None
    # A shell starts a background job with SIGINT ignored: put the handler back (Stopper and Ctrl-C use it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if a.status:
        runs, data = read_records(RUNS)
        for r in runs:
            last = r["curve"][-1] if r["curve"] else None
            name = record_name(r)
            print(
                f"{name}: {r['updates_done']}/{r['updates_target']} updates, {len(r['segments'])} segments, last {last}"
            )
        for d in data:
            kind = "with terminals" if d.get("terminals") else "no terminals"
            print(f"data {d['env']}-task{d['task']} {d['episodes']} ep ({kind}): {d['steps_per_s']} steps/s")
        return
    for env, task, method, seed in specs:
        run_segment(env, task, method, seed, a)
    if a.aggregate:
        aggregate()


if __name__ == "__main__":
    main()
