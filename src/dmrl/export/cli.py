"""``dmrl export``: a checkpoint's chunk planner as an ONNX graph, checked against torch before it is kept."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ExportConfig:
    """``dmrl export --checkpoint RUN/checkpoint --out policy.onnx``."""

    checkpoint: Path
    """A policy checkpoint directory (policy.safetensors + config.json): diffusion, gaussian, vae or student, on
    state or multimodal observations (an instruction enters as its LanguageEncoder embedding)."""
    out: Path | None = None
    """The .onnx file to write (plus OUT.json: input spec, opset, operators, Ascend ATC check); default:
    <checkpoint>/policy.onnx."""
    batch_size: int = 1
    """Static batch of the graph (1 for a robot; the planner serves any batch by running rows in graph batches)."""
    inference_steps: int | None = None
    """DDIM steps unrolled into the graph; default: the policy's own."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"--batch-size: got {self.batch_size}; must be >= 1")
        if self.inference_steps is not None and self.inference_steps < 1:
            raise ValueError(f"--inference-steps: got {self.inference_steps}; must be >= 1")


def run_export(cfg: ExportConfig) -> dict:
    from dmrl.export.onnx import export_onnx
    from dmrl.paths import check_output_path
    from dmrl.policies.checkpoint import load_policy

    policy, meta = load_policy(cfg.checkpoint)
    if cfg.inference_steps is not None:
        if not hasattr(policy, "set_sampler"):
            raise ValueError(f"--inference-steps applies to diffusion policies; {cfg.checkpoint} is {policy.name}")
        policy.set_sampler(cfg.inference_steps)
    out = cfg.out or Path(cfg.checkpoint) / "policy.onnx"
    check_output_path(out, directory=False)  # it writes OUT and OUT.json
    report = export_onnx(policy, out, cfg.batch_size, meta={"checkpoint": str(cfg.checkpoint), **meta})
    summary = {
        "onnx": str(report.path),
        "inputs": {k: list(s) for k, (s, _) in report.inputs.items()},
        "max_abs_diff_vs_torch": report.max_abs_diff,
        "file_mb": round(report.file_mb, 2),
        "ascend_atc_ok": json.loads(Path(f"{report.path}.json").read_text())["ascend_atc"]["ok"],
    }
    print(json.dumps(summary, indent=2))
    return summary
