"""Ascend readiness without Ascend hardware: an exported graph checked against the ONNX operators ATC documents.

ATC (``atc --framework=5``) parses an ONNX model operator by operator, and its documentation lists, per operator,
the opset versions it accepts (``data/ascend_atc_onnx_ops.json`` holds what was transcribed, with its source and
CANN version). :func:`check_ascend` reports every node whose operator is documented as unsupported at the graph's
opset, a forbidden construct (Loop / If / Scan: the sampler must be unrolled; Einsum), a non-standard domain, and
any tensor without a static shape. :func:`ascend_rewrites` replaces, in place, the few operators the exporter emits
that ATC documents only for older opsets, by exactly equivalent ones it documents for the current opset.
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
    for vi in [*g.input, *g.output, *g.value_info]:
        if not _static(vi):
            report.dynamic.append(vi.name)
    return report


def ascend_rewrites(path: str) -> dict[str, int]:
    """Rewrite, in place, ops ATC documents only for older opsets (or not at all) as exactly equal ones it documents
    for opset 18; returns {op: nodes rewritten}.

    IsNaN(x) -> Not(Equal(x, x)) (NaN is the one value unequal to itself; the exporter's attention zeroes fully
    masked rows with IsNaN after its Softmax). Sub(a, b) -> Add(a, Mul(b, -1)) (ATC documents Sub up to opset 15;
    negation is exact in IEEE arithmetic, so a + (-b) == a - b bit for bit).
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(path)
    types = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in [*onnx.shape_inference.infer_shapes(model).graph.value_info, *model.graph.input]
    }
    types |= {init.name: init.data_type for init in model.graph.initializer}
    nodes, done, minus = [], {"IsNaN": 0, "Sub": 0}, {}
    for node in model.graph.node:
        std = node.domain in ("", "ai.onnx")
        if std and node.op_type == "IsNaN":
            same = f"{node.output[0]}__equal_self"
            nodes.append(helper.make_node("Equal", [node.input[0]] * 2, [same], name=f"{node.name}_equal"))
            nodes.append(helper.make_node("Not", [same], list(node.output), name=f"{node.name}_not"))
        elif std and node.op_type == "Sub":
            dtype = types.get(node.input[1], TensorProto.FLOAT)
            if dtype not in minus:
                minus[dtype] = f"__minus_one_{dtype}"
                value = np.array(-1, dtype=helper.tensor_dtype_to_np_dtype(dtype))
                model.graph.initializer.append(numpy_helper.from_array(value, minus[dtype]))
            negated = f"{node.output[0]}__negated"
            nodes.append(helper.make_node("Mul", [node.input[1], minus[dtype]], [negated], name=f"{node.name}_neg"))
            nodes.append(helper.make_node("Add", [node.input[0], negated], list(node.output), name=f"{node.name}_add"))
        else:
            nodes.append(node)
            continue
        done[node.op_type] += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, path)
    return done
