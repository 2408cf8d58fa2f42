"""Non-finite losses and gradients in full or bf16 precision stop a run before anything non-finite is saved.

fp16 is left to its loss scaler, which skips a step whose gradients overflow and lowers the scale (by design).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor


class NonFiniteError(RuntimeError):
    """A loss or gradient norm became NaN or ±inf."""


class FiniteWatch:
    """Records the first update whose logs (losses, gradient norms) hold NaN or ±inf, without a device sync per step:
    the test runs on the device, and ``check()``, where the loop logs or saves, reads the result. So no non-finite
    weights reach a training state or a checkpoint."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.first: Tensor | None = None  # 0-d: step of the first bad update, -1 while there is none
        self.first_host: int | None = None  # the same, found in host-side values (floats, numpy arrays)
        self.last: dict[str, Any] = {}

    def observe(self, step: int, logs: dict[str, Any]) -> None:
        """Take update ``step``'s logs (0-d tensors, floats, per-item numpy arrays)."""
        if not self.enabled:
            return
        self.last = logs
        tensors = [v for v in logs.values() if torch.is_tensor(v) and v.ndim == 0 and v.is_floating_point()]
        if tensors:
            ok = torch.isfinite(torch.stack([t.detach().float() for t in tensors])).all()
            here = torch.where(ok, -1, step)
            self.first = here if self.first is None else torch.where(self.first >= 0, self.first, here)
        if self.first_host is None and not all(_finite_host(v) for v in logs.values() if not torch.is_tensor(v)):
            self.first_host = step

    def check(self, last_saved: int | None) -> None:
        """Raise NonFiniteError naming the first bad update and what was non-finite, if any."""
        if not self.enabled:
            return
        steps = [s for s in (self.first_host, int(self.first) if self.first is not None else -1) if s is not None]
        bad = [s for s in steps if s >= 0]
        if not bad:
            return
        keys = [
            k for k, v in self.last.items() if not _finite_host(v.detach().cpu().numpy() if torch.is_tensor(v) else v)
        ]
        kept = f"the last saved state (step {last_saved}) is kept" if last_saved else "no training state was saved"
        raise NonFiniteError(
            f"step {min(bad)}: non-finite {', '.join(keys) or 'loss or gradient'} (NaN/inf); training stopped before "
            f"saving it and {kept}: lower the learning rate (--algo.lr / --algo.actor-lr), check the data "
            "(dmrl info), or keep --engine.grad-clip on"
        )


def _finite_host(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return bool(np.isfinite(v).all())
    return True
