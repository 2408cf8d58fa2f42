"""Command line: ``dmrl collect | info | data | train | distill | eval | compare | export | serve | demo`` over typed
dataclass configs (tyro).

Every command accepts ``--config PRESET.yaml`` (a YAML of config overrides, see configs/) before its flags;
flags override the preset. Bad input of any kind is reported as one line on stderr with exit status 2.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro


@dataclass
class InfoConfig:
    """``dmrl info``: print a summary of an episode store."""

    path: tyro.conf.Positional[Path]
    """The episode store to describe."""


def _run_info(cfg: InfoConfig) -> None:
    from dmrl.data import EpisodeStore, nonfinite_report

    store = EpisodeStore.open(cfg.path)
    attrs = {k: store.attrs.get(k) for k in ("env_id", "obs_modes", "obs_spec", "action_meaning")}
    # nonfinite: {key: {"count": NaN/inf values, "first": [[episode, step], ...]}}, {} when clean (rgb not read)
    doc = {"path": str(cfg.path), **attrs, **store.summary(), "nonfinite": nonfinite_report(store)}
    print(json.dumps(doc, indent=2, default=str))


def _run_collect(cfg) -> None:
    from dmrl.data.collect import collect

    store = collect(cfg)
    print(json.dumps(store.summary(), default=str))


def _run_train(cfg) -> None:
    from dmrl.train.run import train

    summary = train(cfg)
    print(json.dumps(summary, indent=2, default=str))
    print(f"checkpoint: {cfg.out / 'checkpoint'}")


def _commands() -> dict[str, tuple[type, object, str]]:
    from dmrl.data.collect import CollectConfig
    from dmrl.data.importers.cli import DataCommand, run_data
    from dmrl.eval_command import EvalConfig, run_eval
    from dmrl.export.cli import ExportConfig, run_export
    from dmrl.serve.cli import ServeConfig, run_serve
    from dmrl.train.compare import CompareConfig, DemoConfig, run_compare, run_demo
    from dmrl.train.config import TrainConfig
    from dmrl.train.distill import DistillCommandConfig, run_distill

    return {
        "collect": (CollectConfig, _run_collect, "roll out the scripted expert into an episode store"),
        "info": (InfoConfig, _run_info, "summarise an episode store"),
        "data": (DataCommand, run_data, "import LeRobot v3 / robomimic HDF5 to a store; export a store as LeRobot v3"),
        "train": (
            TrainConfig,
            _run_train,
            "train a policy: behaviour cloning, offline or online RL (--policy.type, --algo.type, --source.type)",
        ),
        "distill": (DistillCommandConfig, run_distill, "a one- or two-step student of a diffusion checkpoint"),
        "eval": (EvalConfig, run_eval, "closed-loop evaluation of a checkpoint on fixed seeds"),
        "compare": (CompareConfig, run_compare, "train MLP, VAE and diffusion on one dataset and compare them"),
        "export": (ExportConfig, run_export, "a diffusion checkpoint's chunk planner as a checked ONNX graph"),
        "serve": (ServeConfig, run_serve, "serve a checkpoint's reset / act to robots over a WebSocket (msgpack)"),
        "demo": (DemoConfig, run_demo, "the main job on its embedded default (make demo)"),
    }


def _usage(commands: dict) -> str:
    lines = ["usage: dmrl COMMAND [--config PRESET.yaml] [flags]   (dmrl COMMAND --help for flags)", ""]
    lines += [f"  {name:<8} {desc}" for name, (_, _, desc) in commands.items()]
    return "\n".join(lines)


def _split_preset(argv: list[str]) -> tuple[Path | None, list[str]]:
    for i, a in enumerate(argv):
        if a == "--config":
            if i + 1 >= len(argv):
                raise ValueError("--config needs a path to a YAML preset (see configs/)")
            return Path(argv[i + 1]), argv[:i] + argv[i + 2 :]
        if a.startswith("--config="):
            return Path(a.split("=", 1)[1]), argv[:i] + argv[i + 1 :]
    return None, argv


def _parse(cls: type, argv: list[str], prog: str, default=None):
    """tyro parsing, with its boxed multi-line errors turned into the one line every dmrl error is.

    ``--FIELD.type NAME`` flags of choice fields (e.g. --policy.type) are applied first; the parser then sees the
    config class narrowed to the chosen types, so its flags and help are those of the chosen policy/algorithm, less
    the config's own fields that those types ignore (its ``inapplicable()``, e.g. train's --batch-size under dppo)."""
    from dmrl.config_utils import choices, cli_type, pop_type_flags

    parsed_type, registry = cls, None
    if choices(cls) or getattr(cls, "__parameters__", ()):  # choice fields, or generic ones (compare: train)
        default = cls() if default is None else default
        default, argv = pop_type_flags(default, argv)
        parsed_type = cli_type(cls, default)
        hidden = default.inapplicable() if hasattr(default, "inapplicable") else {}
        for name, why in hidden.items():
            flag = "--" + name.replace("_", "-")
            if any(a.split("=", 1)[0].replace("_", "-") == flag for a in argv):
                raise ValueError(f"{flag} does not apply: {why}; drop it")
        registry = _hiding(default, tuple(hidden)) if hidden else None
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            return tyro.cli(parsed_type, args=argv, prog=prog, default=default, registry=registry)
    except SystemExit as e:
        if e.code in (0, None):
            raise
        print(f"dmrl: error: {_first_message(buf.getvalue(), prog)}", file=sys.stderr)
        return None


def _hiding(default: object, names: tuple[str, ...]) -> tyro.constructors.ConstructorRegistry:
    """A tyro registry under which the top-level config ``default`` lacks the flags of its fields ``names`` (they
    keep ``default``'s values): tyro's own spec of that struct, those fields marked Suppress."""
    import dataclasses
    from typing import Annotated

    registry, busy = tyro.constructors.ConstructorRegistry(), []

    @registry.struct_rule
    def hide(info: tyro.constructors.StructTypeInfo) -> tyro.constructors.StructConstructorSpec | None:
        if info.default is not default or busy:  # nested structs, and the call below: tyro's default rules
            return None
        busy.append(True)
        try:
            spec = tyro.constructors.ConstructorRegistry.get_struct_spec(info)
        finally:
            busy.pop()
        if not isinstance(spec, tyro.constructors.StructConstructorSpec):
            return None
        fields = [
            dataclasses.replace(f, type=Annotated[f.type, tyro.conf.Suppress]) if f.name in names else f
            for f in spec.fields
        ]
        return dataclasses.replace(spec, fields=tuple(fields))

    return registry


def _first_message(text: str, prog: str) -> str:
    """The first paragraph of a tyro error box as one line (box drawing and colour codes removed)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    words: list[str] = []
    for line in text.splitlines():
        line = line.strip(" │|╭╮╰╯─")  # box drawing only: a flag's leading dashes stay
        titles = ("Value error", "Parsing error", "Unrecognized options", "Required options")
        if not line or line in titles or line.startswith(("usage:", "Usage:")):
            if words:
                break
            continue
        if set(line) <= set("─━-"):
            if words:
                break
            continue
        words.append(line)
    msg = " ".join(words) or "invalid arguments"
    return f"{msg} (see {prog} --help)"


class _StderrHandler(logging.StreamHandler):
    """Progress messages of dmrl's loggers on the *current* sys.stderr (stdout carries results: JSON, tables)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    root = logging.getLogger("dmrl")
    handler, level = _StderrHandler(), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def parse_config(argv: list[str], commands: dict | None = None):
    """The config ``dmrl ARGV`` runs with: ``argv[0]`` the command, then its flags and any ``--config PRESET.yaml``
    (e.g. a benchmark comparing a finished run's config.json with the command it would run). A ValueError names a bad
    flag; None: help was printed, or tyro reported the error."""
    commands = _commands() if commands is None else commands
    name, rest = argv[0], argv[1:]
    if name not in commands:
        raise ValueError(f"unknown command {name!r}; commands: {', '.join(commands)}")
    cls = commands[name][0]
    preset, rest = _split_preset(rest)
    default = None
    if preset is not None:
        from dmrl.config_utils import load_yaml, merge

        if name not in ("train", "compare", "demo"):
            raise ValueError(f"--config presets are for train, compare and demo, not {name}")
        default = merge(cls(), load_yaml(preset))
    return _parse(cls, rest, f"dmrl {name}", default)


def _main(argv: list[str]) -> int:
    try:
        commands = _commands()
        if not argv or argv[0] in ("-h", "--help"):
            print(_usage(commands))
            return 0 if argv else 2
        name = argv[0]
        cfg = parse_config(argv, commands)
        if cfg is None:
            return 2
        commands[name][1](cfg)
    except (ValueError, KeyError, FileNotFoundError, FileExistsError, RuntimeError) as e:
        # Bad input is reported in one line; nothing written before has been touched.
        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"dmrl: error: {msg.splitlines()[0] if msg else type(e).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dmrl: interrupted; everything completed so far (episodes, checkpoints) is kept", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
