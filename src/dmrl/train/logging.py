"""A training run's metric log: ``metrics.jsonl`` plus TensorBoard under ``tb/``, resume-aware, rank-0 only.

Every trainer writes the same way, so curves from BC and RL runs read alike, and a resumed run never shows two
values for one step: on resume both logs are cut back to the step of the state the run continues from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def truncate_jsonl(path: Path, step: int) -> None:
    """Drop the records of ``path`` logged after ``step`` (atomically: rewritten to a temp file, then renamed)."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= step]
    tmp = path.with_suffix(".jsonl.partial")
    tmp.write_text("".join(line + "\n" for line in keep))
    tmp.replace(path)


class RunLog:
    """``write(record)`` appends a {"step": int, name: float, ...} record; a no-op where ``enabled`` is False
    (every rank but 0), so trainers call it unconditionally."""

    def __init__(self, out: Path, start_step: int = 0, enabled: bool = True) -> None:
        self.enabled = enabled
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tb"), purge_step=start_step if start_step else None)
        if start_step:
            truncate_jsonl(out / "metrics.jsonl", start_step)
        self.file = (out / "metrics.jsonl").open("a")

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        for k, v in record.items():
            if k != "step":
                self.writer.add_scalar(k, v, record["step"])

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            self.writer.close()
