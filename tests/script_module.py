"""Load a repository script (benchmarks/*.py, scripts/*.py) as a module for a test fixture."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def script_module(relpath: str, name: str, on_path: str | None = None) -> Iterator:
    """Yield ``ROOT / relpath`` loaded as module ``name`` (not the script's file name, which may be a package's:
    ``metaworld``, ``ogbench``); ``on_path`` (e.g. "benchmarks") is put on sys.path while it loads, for its sibling
    imports. Afterwards the module is dropped from sys.modules and sys.path is as it was (the script may add to it)."""
    path = list(sys.path)
    if on_path is not None:
        sys.path.insert(0, str(ROOT / on_path))
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]
    sys.path[:] = path
