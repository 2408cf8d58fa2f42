"""Ascend readiness without Ascend hardware: an exported graph checked against the ONNX operators ATC documents.

ATC (``atc --framework=5``) parses an ONNX model operator by operator, and its documentation lists, per operator,
the opset versions it accepts (``data/ascend_atc_onnx_ops.json`` holds what was transcribed, with its source and
CANN version). :func:`check_ascend` reports every node whose operator is documented as unsupported at the graph's
opset, a forbidden construct (Loop / If / Scan: the sampler must be unrolled; Einsum), a non-standard domain, and
any tensor without a static shape, and a convolution outside the 2-D / 3-D inputs ATC's Conv pages describe.
:mod:`dmrl.export.rewrites` replaces the few operators the exporter emits that ATC documents only for older opsets.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

DATA = "ascend_atc_onnx_ops.json"


@cache
def ascend_ops() -> dict:
    """The data file: {"ops": {op: {"opsets": [...], "page": ...}}, "not_found": [...], "unverified": [...], ...}."""
    return json.loads(resources.files("dmrl.export").joinpath("data", DATA).read_text())


def graph_ops(path: Path) -> dict[str, int]:
    """{op type: count} over an ONNX file's nodes, subgraphs and local functions included, sorted by name."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts: Counter[str] = Counter()

    def walk(nodes) -> None:  # noqa: ANN001
        for node in nodes:
            counts[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"] += 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g.node)
                for g in attr.graphs:
                    walk(g.node)

    walk(model.graph.node)
    for fn in model.functions:
        walk(fn.node)
    return dict(sorted(counts.items()))


@dataclass
class AscendReport:
    """What :func:`check_ascend` found in one graph."""

    opset: int
    ops: dict[str, int]
    """{op type: count} of the graph."""
    unsupported: list[str] = field(default_factory=list)
    """One line per problem: an op ATC documents without this opset or does not document, a forbidden op, a
    non-standard domain."""
    unverified: list[str] = field(default_factory=list)
    """Ops of the graph whose ATC page was not transcribed (see the data file's "unverified")."""
    dynamic: list[str] = field(default_factory=list)
    """Tensors (inputs, outputs, intermediate values) whose shape is not fully static."""

    @property
    def ok(self) -> bool:
        return not self.unsupported and not self.dynamic


def _static(value_info) -> bool:  # noqa: ANN001 (onnx.ValueInfoProto)
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return False
    return all(d.HasField("dim_value") and d.dim_value > 0 for d in t.shape.dim)


def check_ascend(path: Path) -> AscendReport:
    """Check the ONNX file ``path`` against ATC's documented operators (see the module docstring)."""
    import onnx

    model = onnx.load(str(path))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    data = ascend_ops()
    ops = graph_ops(Path(path))
    report = AscendReport(opset, ops)
    for op in ops:
        if "::" in op:
            report.unsupported.append(f"{op}: not in the standard ONNX domain")
        elif op in data["forbidden"]:
            report.unsupported.append(f"{op}: forbidden ({data['forbidden'][op]})")
        elif op in data["ops"]:
            opsets = data["ops"][op]["opsets"]
            if opset not in opsets:
                report.unsupported.append(f"{op}: ATC documents opsets {opsets[0]}..{opsets[-1]}, the graph is {opset}")
        elif op in data["not_found"]:
            report.unsupported.append(f"{op}: not in ATC's ONNX operator list")
        elif op in data["unverified"]:
            report.unverified.append(op)
        else:
            report.unsupported.append(f"{op}: not looked up in ATC's operator list; add it to {DATA}")
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    ranks = {}
    for vi in [*g.input, *g.output, *g.value_info]:
        ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
        if not _static(vi):
            report.dynamic.append(vi.name)
    for node in model.graph.node:
        # ATC's Conv / ConvTranspose pages take 4-D (N, C, H, W) or 5-D inputs: a 1-D convolution is outside them.
        if node.op_type in ("Conv", "ConvTranspose") and ranks.get(node.input[0]) not in (4, 5):
            report.unsupported.append(
                f"{node.op_type} {node.name}: {ranks.get(node.input[0])}-D input; ATC documents 4-D or 5-D only"
            )
    return report
