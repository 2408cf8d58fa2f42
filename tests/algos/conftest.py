"""Fixtures for the algorithm tests; tiny actors, critics and batches live in algo_helpers.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# Make algo_helpers importable whatever pytest's import mode (prepend does this already, importlib not).
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
