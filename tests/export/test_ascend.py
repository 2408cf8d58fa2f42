"""Ascend readiness without Ascend hardware: every exported policy kind passes the ATC operator check (documented
operators at the graph's opset, no Loop / If / Einsum, static shapes); the check itself flags what ATC cannot take;
the rewrites that make the graphs pass are exact."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dmrl.export.ascend import ascend_ops, ascend_rewrites, check_ascend

KINDS = ["multimodal-diffusion", "gaussian", "vae", "student"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_exported_kind_passes_the_atc_operator_check(exported, kind):
    if kind not in exported:
        pytest.skip(f"policy kind {kind!r} is not registered in this checkout")
    ex = exported[kind]
    report = check_ascend(ex.path)
    assert report.opset == 18
    assert report.unsupported == [], report.unsupported
    assert report.dynamic == [], f"tensors without a static shape: {report.dynamic[:5]}"
    assert not {"Loop", "If", "Scan", "Einsum", "IsNaN", "IsInf", "Mish", "Softplus", "Sub"} & set(report.ops)
    documented = set(report.ops) - set(report.unverified)
    assert documented <= set(ascend_ops()["ops"])  # every op either checked against its page or listed unverified
    assert ex.sidecar["ascend_atc"]["ok"] is True  # the export records the same verdict


def _model(nodes, inputs, outputs, opset: int = 18, inits=()) -> onnx.ModelProto:  # noqa: ANN001
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name: str, shape, dtype=TensorProto.FLOAT):  # noqa: ANN001, ANN202
    return helper.make_tensor_value_info(name, dtype, shape)


def test_the_check_flags_what_atc_cannot_take(tmp_path):
    nodes = [
        helper.make_node("Einsum", ["a", "b"], ["e"], equation="ij,jk->ik"),
        helper.make_node("Sub", ["e", "e"], ["s"]),  # ATC documents Sub up to opset 15
        helper.make_node("Mish", ["s"], ["m"]),  # no ATC page
        helper.make_node("Celu", ["m"], ["y"]),  # never looked up
    ]
    path = tmp_path / "bad.onnx"
    onnx.save(_model(nodes, [_vi("a", ["batch", 3]), _vi("b", [3, 3])], [_vi("y", ["batch", 3])]), path)
    report = check_ascend(path)
    assert not report.ok
    flagged = " | ".join(report.unsupported)
    assert "Einsum: forbidden" in flagged and "Sub: ATC documents opsets 8..15, the graph is 18" in flagged
    assert "Mish: not in ATC's ONNX operator list" in flagged and "Celu: not looked up" in flagged
    assert "a" in report.dynamic and "y" in report.dynamic
    # the same graph at opset 15 (Sub documented there), static and without the unknown ops: clean
    ok = _model(nodes[1:2], [_vi("e", [2, 3])], [_vi("s", [2, 3])], opset=15)
    onnx.save(ok, tmp_path / "ok.onnx")
    assert check_ascend(tmp_path / "ok.onnx").ok


def test_rewrites_are_exact_and_remove_sub_and_isnan(tmp_path):
    import onnxruntime as ort

    nodes = [
        helper.make_node("Sub", ["a", "b"], ["d"]),
        helper.make_node("IsNaN", ["d"], ["n"]),
        helper.make_node("Where", ["n", "b", "d"], ["y"]),
    ]
    path = tmp_path / "m.onnx"
    onnx.save(_model(nodes, [_vi("a", [4, 5]), _vi("b", [4, 5])], [_vi("y", [4, 5])]), path)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 5)).astype(np.float32) * 1e3
    a[0, :2] = [np.nan, np.inf]
    feeds = {"a": a, "b": rng.standard_normal((4, 5)).astype(np.float32)}
    before = ort.InferenceSession(str(path)).run(None, feeds)[0]
    assert ascend_rewrites(str(path)) == {"IsNaN": 1, "Sub": 1}
    after = ort.InferenceSession(str(path)).run(None, feeds)[0]
    np.testing.assert_array_equal(after, before)  # bit for bit, NaN and inf rows included
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert ops == {"Mul", "Add", "Equal", "Not", "Where"}


def test_the_operator_list_carries_its_source():
    data = ascend_ops()
    assert data["source"].startswith("Huawei Ascend documentation") and "hiascend.com" in data["source"]
    assert "cann_version" in data and "PARTIAL" in data["completeness"]
    for op, entry in data["ops"].items():
        assert entry["opsets"] == sorted(entry["opsets"]) and entry["page"].startswith("atlasoxol_09_"), op
    assert not set(data["ops"]) & set(data["unverified"]) and not set(data["ops"]) & set(data["not_found"])
