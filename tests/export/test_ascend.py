"""Ascend readiness without Ascend hardware: every exported policy kind passes the ATC operator check (documented
operators at the graph's opset, no Loop / If / Einsum, static shapes); the check itself flags what ATC cannot take;
the rewrites that make the graphs pass are exact."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dmrl.export.ascend import ascend_ops, check_ascend
from dmrl.export.rewrites import ascend_rewrites

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
        helper.make_node("Celu", ["m"], ["c"]),  # never looked up
        helper.make_node("Conv", ["c3", "w"], ["y"]),  # a 1-D convolution: ATC's Conv page takes 4-D / 5-D
    ]
    path = tmp_path / "bad.onnx"
    inputs = [_vi("a", ["batch", 3]), _vi("b", [3, 3]), _vi("c3", [1, 3, 8]), _vi("w", [2, 3, 3])]
    onnx.save(_model(nodes, inputs, [_vi("y", [1, 2, 6])]), path)
    report = check_ascend(path)
    assert not report.ok
    flagged = " | ".join(report.unsupported)
    assert "Einsum: forbidden" in flagged and "Sub: ATC documents opsets 8..15, the graph is 18" in flagged
    assert "Mish: not in ATC's ONNX operator list" in flagged and "Celu: not looked up" in flagged
    assert "Conv" in flagged and "3-D input; ATC documents 4-D or 5-D only" in flagged
    assert "a" in report.dynamic and "e" in report.dynamic
    # the same graph at opset 15 (Sub documented there), static and without the unknown ops: clean
    ok = _model(nodes[1:2], [_vi("e", [2, 3])], [_vi("s", [2, 3])], opset=15)
    onnx.save(ok, tmp_path / "ok.onnx")
    assert check_ascend(tmp_path / "ok.onnx").ok


def test_rewrites_keep_the_values_and_leave_only_documented_ops(tmp_path):
    import onnxruntime as ort
    from onnx import numpy_helper

    inits = [
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "last"),
        numpy_helper.from_array(np.array(-0.5, dtype=np.float32), "lo"),
        numpy_helper.from_array(np.array(0.5, dtype=np.float32), "hi"),
    ]
    nodes = [
        helper.make_node("Sub", ["a", "b"], ["d"]),
        helper.make_node("IsNaN", ["d"], ["n"]),
        helper.make_node("Where", ["n", "b", "d"], ["y"]),  # exact rewrites: y must match bit for bit
        helper.make_node("Unsqueeze", ["y", "axis0"], ["u"]),
        helper.make_node("Clip", ["u", "lo", "hi"], ["c"]),
        helper.make_node("ReduceMean", ["c", "last"], ["m"], keepdims=1),  # 1/N scaling: float rounding
    ]
    outputs = [_vi("y", [4, 5]), _vi("u", [1, 4, 5]), _vi("c", [1, 4, 5]), _vi("m", [1, 4, 1])]
    path = tmp_path / "m.onnx"
    onnx.save(_model(nodes, [_vi("a", [4, 5]), _vi("b", [4, 5])], outputs, inits=inits), path)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 5)).astype(np.float32)
    a[0, :2] = [np.nan, np.inf]
    feeds = {"a": a, "b": rng.standard_normal((4, 5)).astype(np.float32)}
    before = ort.InferenceSession(str(path)).run(None, feeds)
    done = ascend_rewrites(str(path))
    assert done == {"IsNaN": 1, "Sub": 1, "Unsqueeze": 1, "Clip": 1, "ReduceMean": 1}
    after = ort.InferenceSession(str(path)).run(None, feeds)
    for exact_before, exact_after in zip(before[:3], after[:3], strict=True):
        np.testing.assert_array_equal(exact_after, exact_before)  # NaN and inf rows included
    np.testing.assert_allclose(after[3], before[3], rtol=1e-6, atol=1e-7)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert ops == {"Mul", "Add", "Equal", "Not", "Where", "Reshape", "Max", "Min", "ReduceSum"}
    assert check_ascend(path).ok


def test_one_dimensional_convolutions_become_two_dimensional(tmp_path):
    import onnxruntime as ort
    from onnx import numpy_helper

    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((6, 4, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal((6, 5, 4)).astype(np.float32), "wt"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "bias"], ["h"], kernel_shape=[3], pads=[1, 1], strides=[2]),
        helper.make_node("ConvTranspose", ["h", "wt"], ["y"], kernel_shape=[4], pads=[1, 1], strides=[2]),
    ]  # a U-Net's down- and up-sampling pair: (2, 4, 16) -> (2, 6, 8) -> (2, 5, 16)
    path = tmp_path / "c.onnx"
    onnx.save(_model(nodes, [_vi("x", [2, 4, 16])], [_vi("h", [2, 6, 8]), _vi("y", [2, 5, 16])], inits=inits), path)
    feeds = {"x": rng.standard_normal((2, 4, 16)).astype(np.float32)}
    before = ort.InferenceSession(str(path)).run(None, feeds)
    assert not check_ascend(path).ok  # 3-D inputs
    assert ascend_rewrites(str(path)) == {"Conv": 1, "ConvTranspose": 1}
    after = ort.InferenceSession(str(path)).run(None, feeds)
    for b, a in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert check_ascend(path).ok


def test_the_operator_list_carries_its_source():
    data = ascend_ops()
    assert data["source"].startswith("Huawei Ascend documentation") and "hiascend.com" in data["source"]
    assert "cann_version" in data and "PARTIAL" in data["completeness"]
    for op, entry in data["ops"].items():
        assert entry["opsets"] == sorted(entry["opsets"]) and entry["page"].startswith("atlasoxol_09_"), op
    assert not set(data["ops"]) & set(data["unverified"]) and not set(data["ops"]) & set(data["not_found"])
