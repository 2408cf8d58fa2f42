"""Bad input table (issue 31 §4): every flag of every command, fed a wrong type, an out-of-range number, an empty
value or a missing path, fails in one ``dmrl: error: ...`` line with exit status 2, no traceback, nothing written.

The flags are enumerated from each command's config dataclass (nested ones too, in tyro's ``--a.b-c`` spelling;
``train`` also with its other policy / algorithm / source types), so a new flag is covered without editing this file.
Each case runs ``dmrl.cli.main`` in this process with the work itself stubbed out: reaching collection, training,
evaluation or export means the bad value was accepted, and the case fails without doing that work.
benchmarks/reliability.py runs the whole table; this test runs a fixed sample that covers every flag.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import time
import traceback
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from state_store import state_store

CHECKPOINT = Path(__file__).resolve().parent / "artifacts" / "golden_diffusion"
MISSING = "does/not/exist"
BLOCKER = "a_file"  # a regular file in the working directory: an --out below it cannot be created

# train's other types: (variant name, its --X.type flags, the flag prefix whose fields it adds)
TRAIN_VARIANTS: list[tuple[str, list[str], str]] = [
    ("diffusion-bc", [], ""),
    ("gaussian", ["--policy.type", "gaussian"], "--policy."),
    ("vae", ["--policy.type", "vae"], "--policy."),
    ("diffusion-ql", ["--algo.type", "diffusion-ql"], "--algo."),
    ("td3-bc", ["--algo.type", "td3-bc", "--policy.type", "gaussian"], "--algo."),
    ("qc", ["--algo.type", "qc"], "--algo."),
    ("idql", ["--algo.type", "idql"], "--algo."),
    ("fql", ["--algo.type", "fql"], "--algo."),
    ("online", ["--source.type", "online", "--algo.type", "diffusion-ql"], "--source."),
]

# Flags that take any string (a name): no value of theirs is invalid, so none is generated.
FREE_TEXT: dict[str, str] = {"--host": "serve's interface: a host name or address, checked when it binds"}

# (command, flag, value) that are valid although the generator makes them: a documented meaning. The command is
# the base one ("train" covers its variants too).
ACCEPTED: dict[tuple[str, str, str], str] = {
    ("collect", "--workers", "0"): "0 workers: everything in this process",
    ("eval", "--out", ""): "the working directory, an existing writable directory",
    ("eval", "--gif-episodes", "0"): "0: no GIF",
    ("compare", "--out", ""): "the working directory, an existing writable directory",
    ("compare", "--select-episodes", "0"): "0: no learning-rate selection episodes",
    ("train", "--algo.warmup-steps", "0"): "0: no warm-up",
    ("compare", "--train.warmup-steps", "0"): "0: no warm-up",
    ("train", "--engine.save-every", "0"): "0: no intermediate training states",
    ("distill", "--engine.save-every", "0"): "0: no intermediate training states",
    ("distill", "--warmup-steps", "0"): "0: no warm-up",
    ("serve", "--port", "0"): "0: any free port",
    ("compare", "--train.engine.save-every", "0"): "0: no intermediate training states",
    ("train", "--policy.min-log-std", "-1"): "a log standard deviation may be negative",
    ("train", "--policy.max-log-std", "-1"): "a log standard deviation may be negative",
    ("compare", "--train.gaussian.min-log-std", "-1"): "a log standard deviation may be negative",
    ("compare", "--train.gaussian.max-log-std", "-1"): "a log standard deviation may be negative",
}


@dataclasses.dataclass(frozen=True)
class Case:
    command: str  # "train" or "train[gaussian]" for a train variant
    flag: str  # "--source.val-fraction", or "PATH" for a positional
    value: tuple[str, ...]  # the bad value's words (() for a flag given with nothing after it)
    argv: tuple[str, ...]

    @property
    def id(self) -> str:
        shown = " ".join(repr(v) if not v or " " in v else v for v in self.value) or "<nothing>"
        return f"{self.command} {self.flag} {shown}"


class WorkStarted(BaseException):
    """Raised by the stubs of real work: the command accepted its input. BaseException: no handler catches it."""


# ---------------------------------------------------------------------------------------------- flags and values
def _positional(hint: typing.Any) -> bool:
    return any("Positional" in repr(m) or "positional" in repr(m).lower() for m in getattr(hint, "__metadata__", ()))


def _strip(hint: typing.Any) -> tuple[typing.Any, bool]:
    """(the type inside Annotated / Optional, whether None is allowed)."""
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


def flags(cfg: typing.Any, prefix: str = "--") -> Iterator[tuple[str, typing.Any, typing.Any]]:
    """(flag, type, default) of every leaf field of dataclass instance ``cfg``, nested dataclasses recursed into."""
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    for f in dataclasses.fields(cfg):
        if not f.init:
            continue
        value = getattr(cfg, f.name, None)
        flag = prefix + f.name.replace("_", "-")
        if dataclasses.is_dataclass(value):
            yield from flags(value, flag + ".")
        else:
            yield flag, hints[f.name], value


def _probability(flag: str) -> bool:
    name = flag.rsplit(".", 1)[-1].removeprefix("--")
    if name.startswith("weight-"):  # weight decay is a coefficient, not a probability
        return False
    return any(w in name for w in ("prob", "fraction", "decay", "discount", "gamma", "tau", "expectile"))


def bad_values(flag: str, hint: typing.Any, default: typing.Any) -> list[tuple[str, ...]]:
    """Invalid values for a flag of type ``hint``: wrong type, out of range, empty, missing path."""
    base, optional = _strip(hint)
    origin = typing.get_origin(base)
    name = flag.rsplit(".", 1)[-1].removeprefix("--")
    if base is bool:
        return [("abc",)]
    if base is int:
        out = [("abc",), ("1.5",), ("",), ("-1",)]
        if isinstance(default, int) and default >= 1 and "seed" not in name:
            out.append(("0",))
        return out
    if base is float:
        out = [("abc",), ("",), ("-1",)]
        return out + [("1.5",)] if _probability(flag) else out
    if base is Path:
        if name == "out":
            return [("",), (f"{BLOCKER}/sub",)]
        return [(MISSING,), ("",)]
    if base is str:
        return [] if flag in FREE_TEXT else [("abc",), ("",)]
    if origin is typing.Literal:
        return [("abc",), ("",)]
    if origin is tuple:
        (item, *_) = typing.get_args(base) or (str,)
        words: list[tuple[str, ...]] = [("abc",)]
        if item in (int, float):
            words.append(("-1",))
        return [*([()] if default else []), *words]  # () is bad only where the default has values
    if origin is dict or base is dict:
        return [("abc",)]
    raise TypeError(f"{flag}: no bad values for type {hint!r}; teach bad_values() this type")


# ---------------------------------------------------------------------------------------------- the commands
def _base(command: str, store: Path) -> dict[str, tuple[str, ...]]:
    """A valid, cheap argv per command (flag -> words): the flag under test replaces its entry."""
    return {
        "collect": {"--out": ("d.zarr",), "--episodes": ("1",), "--workers": ("0",), "--obs-modes": ("state",)},
        "info": {"PATH": (str(store),)},
        "train": {"--dataset": (str(store),), "--out": ("run",), "--steps": ("2",), "--batch-size": ("4",)},
        "eval": {"--checkpoint": (str(CHECKPOINT),), "--out": ("ev",), "--episodes": ("1",), "--envs": ("1",)},
        "export": {"--checkpoint": (str(CHECKPOINT),), "--out": ("p.onnx",)},
        "compare": {"--dataset": (str(store),), "--out": ("cmp",), "--parallel": ("1",), "--gifs": ()},
        "demo": {"--out": ("demo",)},
        "distill": {
            "--teacher": (str(CHECKPOINT),),
            "--dataset": (str(store),),
            "--out": ("st",),
            "--steps": ("2",),
            "--batch-size": ("4",),
        },
        "serve": {"--checkpoint": (str(CHECKPOINT),), "--port": ("0",)},
    }[command]


def _argv(command: str, type_flags: list[str], base: dict, flag: str, value: tuple[str, ...]) -> tuple[str, ...]:
    if flag == "PATH":
        return (command, *value)
    argv = [command, *type_flags]
    for f, words in base.items():
        if f != flag:
            argv += [f, *words] if f != "PATH" else list(words)
    return (*argv, flag, *value)


def _config_cases(command: str, cfg: typing.Any, type_flags: list[str], only: str, store: Path) -> list[Case]:
    base = _base(command, store)
    cases = []
    for flag, hint, default in flags(cfg):
        if only and not flag.startswith(only):
            continue
        key = "PATH" if _positional(hint) else flag
        for value in bad_values(flag, hint, default):
            if (command, key, " ".join(value)) in ACCEPTED:
                continue
            cases.append(Case(command, key, value, _argv(command, type_flags, base, key, value)))
    return cases


def all_cases(store: Path) -> list[Case]:
    """Every generated case of every command (demo: its flags except --out, whose valid values start work)."""
    from dmrl.cli import _commands
    from dmrl.config_utils import pop_type_flags

    commands = _commands()
    cases: list[Case] = []
    for command in ("collect", "info", "eval", "export", "compare", "distill", "serve"):
        cls = commands[command][0]
        cfg = _instance(cls)
        cases += _config_cases(command, cfg, [], "", store)
    train_cls = commands["train"][0]
    for variant, type_flags, only in TRAIN_VARIANTS:
        cfg, _ = pop_type_flags(train_cls(), list(type_flags))
        for c in _config_cases("train", cfg, type_flags, only, store):
            cases.append(dataclasses.replace(c, command="train" if not only else f"train[{variant}]"))
    demo = _config_cases("demo", _instance(commands["demo"][0]), [], "", store)
    # demo --out "" is the working directory, a valid place to write the demo: generated only as "under a file".
    cases += [c for c in demo if not (c.flag == "--out" and c.value == ("",))]
    return cases


def _instance(cls: type) -> typing.Any:
    """A default instance for enumerating fields; required fields (no default) get a placeholder."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = Path(MISSING)
    with mock.patch.object(cls, "__post_init__", lambda self: None, create=True):
        return cls(**kwargs)


# ---------------------------------------------------------------------------------------------- running a case
def _work_stubs() -> list[typing.Any]:
    """Patches that raise WorkStarted where each command's real work begins (after all its input checks)."""

    def stop(*args: typing.Any, **kwargs: typing.Any) -> None:
        raise WorkStarted

    import concurrent.futures

    return [
        mock.patch("dmrl.data.collect._episodes", stop),  # collect: the rollouts (store already created)
        mock.patch("dmrl.train.compare._collect", stop),  # compare collecting a dataset (none given)
        mock.patch("dmrl.train.offline.OfflineSource.start", stop),  # train: loaders (the run dir is prepared)
        mock.patch("dmrl.train.online.OnlineSource.start", stop),  # train online: replay + collector processes
        mock.patch("dmrl.train.evaluate.evaluate", stop),  # eval
        mock.patch("dmrl.export.onnx.export_onnx", stop),  # export
        mock.patch("dmrl.train.compare._train_one", stop),  # compare, --parallel 1
        mock.patch.object(concurrent.futures, "ProcessPoolExecutor", stop),  # compare, --parallel > 1
        mock.patch("dmrl.train.compare._scene_frames", stop),  # demo
        mock.patch("dmrl.serve.server.PolicyServer.start", stop),  # serve: binding the port
    ]


@dataclasses.dataclass
class Outcome:
    code: int | None  # exit status; None when the work started (the input was accepted)
    stderr: str
    changed: list[str]
    seconds: float

    def problems(self) -> list[str]:
        lines = self.stderr.strip().splitlines()
        out = []
        if self.code is None:
            out.append("accepted: the command went on to its work")
        elif self.code != 2:
            out.append(f"exit status {self.code}, not 2")
        if "Traceback" in self.stderr:
            out.append("traceback on stderr")
        if len(lines) > 3:
            out.append(f"{len(lines)} lines on stderr")
        if self.code is not None and not any(ln.startswith("dmrl: error: ") for ln in lines):
            out.append("no 'dmrl: error:' line")
        if self.changed:
            out.append(f"files changed: {self.changed[:3]}")
        return out


def snapshot(*roots: Path) -> dict[str, tuple]:
    """{path: (size, mtime, sha1 of small files)} of every entry below ``roots``."""
    out: dict[str, tuple] = {}
    for root in roots:
        for p in [root, *root.rglob("*")] if root.exists() else []:
            st = p.lstat()
            digest = hashlib.sha1(p.read_bytes()).hexdigest() if p.is_file() and st.st_size < 1 << 20 else ""
            out[str(p)] = (p.is_dir(), st.st_size if p.is_file() else 0, st.st_mtime_ns, digest)
    return out


def run_case(case: Case, workdir: Path, watched: tuple[Path, ...]) -> Outcome:
    """Run one case with cwd = ``workdir``; compare ``workdir`` and ``watched`` before and after."""
    from dmrl.cli import main

    before = snapshot(workdir, *watched)
    err, out = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    cwd = os.getcwd()
    code: int | None
    with contextlib.ExitStack() as stack:
        for p in _work_stubs():
            stack.enter_context(p)
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(contextlib.redirect_stdout(out))
        os.chdir(workdir)
        try:
            code = main(list(case.argv))
        except WorkStarted:
            code = None
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except Exception:  # noqa: BLE001 - an uncaught exception is the finding
            code = 1
            err.write(traceback.format_exc())
        finally:
            os.chdir(cwd)
    after = snapshot(workdir, *watched)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return Outcome(code, err.getvalue(), changed, time.perf_counter() - t0)


def make_store(path: Path) -> Path:
    """A two-episode state-only MultiPathGrasp store (rewards and terminations: RL can read it too)."""
    return state_store(path, episodes=2, rewards=True, steps=20)


def prepare_workdir(workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / BLOCKER).write_text("a file, not a directory")


def controls(store: Path) -> list[Case]:
    """Each command's base argv with nothing bad: it must reach its work (else the table proves nothing)."""
    out = []
    for command in ("collect", "info", "eval", "export", "compare", "demo", "distill", "serve"):
        base = _base(command, store)
        argv = [command] + [w for f, words in base.items() for w in ([f, *words] if f != "PATH" else words)]
        out.append(Case(command, "", (), tuple(argv)))
    for variant, type_flags, _ in TRAIN_VARIANTS:
        base = _base("train", store)
        argv = ["train", *type_flags] + [w for f, words in base.items() for w in (f, *words)]
        out.append(Case(f"train[{variant}]", "", (), tuple(argv)))
    return out


def sample(cases: list[Case], per_flag: int = 1) -> list[Case]:
    """A fixed subset: the first ``per_flag`` values of every (command, flag), plus every 7th case."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for i, c in enumerate(cases):
        n = seen.get((c.command, c.flag), 0)
        if n < per_flag or i % 7 == 0:
            out.append(c)
        seen[(c.command, c.flag)] = n + 1
    return out


# ---------------------------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("bad_input_store") / "data.zarr")


COMMANDS = ["collect", "info", "train", "eval", "compare", "export", "demo", "distill", "serve"]


@pytest.mark.parametrize("command", COMMANDS)
def test_bad_input_is_one_line_exit_2_nothing_written(command, fixture_store, tmp_path):
    cases = [c for c in sample(all_cases(fixture_store)) if c.command.split("[")[0] == command]
    assert cases, command
    failures = []
    for case in cases:
        workdir = tmp_path / "work"
        prepare_workdir(workdir)
        outcome = run_case(case, workdir, (fixture_store, CHECKPOINT))
        if outcome.problems():
            failures.append(f"{case.id}: {'; '.join(outcome.problems())}\n    {outcome.stderr.strip()[-300:]}")
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures)


@pytest.mark.parametrize("command", COMMANDS)
def test_base_argv_reaches_the_work(command, fixture_store, tmp_path):
    """The table's cases differ from these only in the bad value: each of them must be accepted."""
    for case in [c for c in controls(fixture_store) if c.command.split("[")[0] == command]:
        workdir = tmp_path / case.command
        prepare_workdir(workdir)
        outcome = run_case(case, workdir, ())
        assert outcome.code == (0 if command == "info" else None), f"{case.argv}: exit {outcome.code}\n{outcome.stderr}"
