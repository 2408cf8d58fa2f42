"""Graph rewrites for Ascend ATC: operators the exporter emits that ATC documents only for older opsets (or not at
all), replaced in the ONNX file by equal ones it documents for opset 18 (data/ascend_atc_onnx_ops.json).

    IsNaN(x)                -> Not(Equal(x, x))            NaN is the one value unequal to itself (exact)
    Sub(a, b)               -> Add(a, Mul(b, -1))           negation is exact in IEEE arithmetic (exact)
    Unsqueeze(x, axes)      -> Reshape(x, static shape)     the same bytes, a new shape (exact)
    Clip(x, lo, hi)         -> Min(Max(x, lo), hi)          ONNX defines Clip so (exact)
    ReduceMean(x, axes)     -> Mul(ReduceSum(x, axes), 1/N) N = the reduced element count (float rounding)
    Conv / ConvTranspose    1-D (N, C, L) -> 2-D on (N, C, 1, L) with a (.., 1, k) kernel, reshaped back: ATC's
                            pages take 4-D / 5-D inputs only (the U-Net denoiser's 1-D convolutions; float rounding)

The exporter's own Mish and nan_to_num translations (export/onnx.py) avoid Softplus, IsInf and Mish in the first
place. A node whose shapes or constant inputs cannot be read statically is left as it is, and the check
(:func:`dmrl.export.ascend.check_ascend`) reports it. The export's parity check runs after these rewrites.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _static_shapes(model) -> dict[str, tuple[int, ...]]:  # noqa: ANN001
    import onnx

    g = onnx.shape_inference.infer_shapes(model).graph
    shapes = {}
    for vi in [*g.input, *g.output, *g.value_info]:
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(d.dim_value for d in dims)
    return shapes


def _types(model) -> dict[str, int]:  # noqa: ANN001
    import onnx

    g = onnx.shape_inference.infer_shapes(model).graph
    out = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.output, *g.value_info]}
    return out | {init.name: init.data_type for init in model.graph.initializer}


def _constants(model) -> dict[str, np.ndarray]:  # noqa: ANN001
    from onnx import numpy_helper

    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


class _Rewriter:
    """One pass over a model's nodes; each handler returns the nodes that replace one, or None to keep it."""

    def __init__(self, model) -> None:  # noqa: ANN001
        self.model = model
        self.shapes = _static_shapes(model)
        self.types = _types(model)
        self.constants = _constants(model)
        self.count = 0
        self.kernels2d: dict[str, str] = {}

    def constant(self, value: np.ndarray, hint: str) -> str:
        from onnx import numpy_helper

        self.count += 1
        name = f"__ascend_{hint}_{self.count}"
        self.model.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def dtype(self, name: str):  # noqa: ANN201
        from onnx import TensorProto, helper

        return helper.tensor_dtype_to_np_dtype(self.types.get(name, TensorProto.FLOAT))

    def isnan(self, node):  # noqa: ANN001, ANN201
        from onnx import helper

        same = f"{node.output[0]}__equal_self"
        return [
            helper.make_node("Equal", [node.input[0]] * 2, [same], name=f"{node.name}_equal"),
            helper.make_node("Not", [same], list(node.output), name=f"{node.name}_not"),
        ]

    def sub(self, node):  # noqa: ANN001, ANN201
        from onnx import helper

        minus = self.constant(np.array(-1, dtype=self.dtype(node.input[1])), "minus_one")
        negated = f"{node.output[0]}__negated"
        return [
            helper.make_node("Mul", [node.input[1], minus], [negated], name=f"{node.name}_neg"),
            helper.make_node("Add", [node.input[0], negated], list(node.output), name=f"{node.name}_add"),
        ]

    def unsqueeze(self, node):  # noqa: ANN001, ANN201
        from onnx import helper

        shape = self.shapes.get(node.output[0])
        if shape is None:
            return None
        target = self.constant(np.array(shape, dtype=np.int64), "shape")
        return [helper.make_node("Reshape", [node.input[0], target], list(node.output), name=f"{node.name}_reshape")]

    def clip(self, node):  # noqa: ANN001, ANN201
        from onnx import helper

        x, out = node.input[0], node.output[0]
        lo = node.input[1] if len(node.input) > 1 and node.input[1] else None
        hi = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if lo is None and hi is None:
            return [helper.make_node("Identity", [x], [out], name=f"{node.name}_identity")]
        nodes = []
        if lo is not None:
            low = out if hi is None else f"{out}__low"
            nodes.append(helper.make_node("Max", [x, lo], [low], name=f"{node.name}_max"))
            x = low
        if hi is not None:
            nodes.append(helper.make_node("Min", [x, hi], [out], name=f"{node.name}_min"))
        return nodes

    def reduce_mean(self, node):  # noqa: ANN001, ANN201
        from onnx import helper

        shape = self.shapes.get(node.input[0])
        attrs = {a.name: a.i for a in node.attribute}
        axes_name = node.input[1] if len(node.input) > 1 and node.input[1] else None
        if shape is None or (axes_name is not None and axes_name not in self.constants):
            return None
        axes = [int(a) for a in self.constants[axes_name].reshape(-1)] if axes_name else list(range(len(shape)))
        if not axes and attrs.get("noop_with_empty_axes", 0):
            return None
        axes = axes or list(range(len(shape)))
        n = int(np.prod([shape[a] for a in axes]))
        summed = f"{node.output[0]}__sum"
        inputs = [node.input[0]] + ([axes_name] if axes_name else [])
        scale = self.constant(np.array(1.0 / n, dtype=self.dtype(node.input[0])), "inv_count")
        keep = attrs.get("keepdims", 1)
        return [
            helper.make_node("ReduceSum", inputs, [summed], keepdims=keep, name=f"{node.name}_sum"),
            helper.make_node("Mul", [summed, scale], list(node.output), name=f"{node.name}_scale"),
        ]

    def conv1d(self, node):  # noqa: ANN001, ANN201
        from onnx import helper

        x, w = node.input[0], node.input[1]
        shape_x, shape_y = self.shapes.get(x), self.shapes.get(node.output[0])
        if shape_x is None or len(shape_x) != 3 or shape_y is None or w not in self.constants:
            return None
        if w not in self.kernels2d:  # one 2-D copy per weight, however many unrolled steps share it
            kernel = self.constants[w]
            self.kernels2d[w] = self.constant(kernel.reshape(*kernel.shape[:2], 1, kernel.shape[2]), "kernel2d")
        w2 = self.kernels2d[w]
        x2 = self.constant(np.array([shape_x[0], shape_x[1], 1, shape_x[2]], dtype=np.int64), "shape")
        back = self.constant(np.array(shape_y, dtype=np.int64), "shape")
        attrs = {}
        for a in node.attribute:
            value = helper.get_attribute_value(a)
            if a.name == "pads":  # [begin, end] -> [top 0, begin, bottom 0, end]
                value = [0, value[0], 0, value[1]]
            elif a.name in ("kernel_shape", "strides", "dilations", "output_padding"):
                value = [1 if a.name != "output_padding" else 0, *value]
            elif a.name == "output_shape":
                value = [1, *value]
            attrs[a.name] = value
        name = node.name
        return [
            helper.make_node("Reshape", [x, x2], [f"{name}__x2d"], name=f"{name}_to2d"),
            helper.make_node(
                node.op_type, [f"{name}__x2d", w2, *node.input[2:]], [f"{name}__y2d"], name=f"{name}_2d", **attrs
            ),
            helper.make_node("Reshape", [f"{name}__y2d", back], list(node.output), name=f"{name}_to1d"),
        ]


def ascend_rewrites(path: str) -> dict[str, int]:
    """Apply the module's rewrites to the ONNX file ``path`` in place; returns {op: nodes rewritten}."""
    import onnx

    model = onnx.load(path)
    r = _Rewriter(model)
    handlers: dict[str, Callable] = {
        "IsNaN": r.isnan,
        "Sub": r.sub,
        "Unsqueeze": r.unsqueeze,
        "Clip": r.clip,
        "ReduceMean": r.reduce_mean,
        "Conv": r.conv1d,
        "ConvTranspose": r.conv1d,
    }
    done = dict.fromkeys(handlers, 0)
    nodes = []
    for node in model.graph.node:
        handler = handlers.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if handler and not node.name:  # the replacement nodes' names derive from it: they must be unique
            node.name = f"{node.op_type}__{node.output[0]}"
        new = handler(node) if handler else None
        if new is None:
            nodes.append(node)
            continue
        nodes.extend(new)
        done[node.op_type] += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    # Drop initializers no node reads any more (the 1-D kernels, Unsqueeze's axes): they would only bloat the file.
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    kept = [init for init in model.graph.initializer if init.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    onnx.save(model, path)
    return {k: v for k, v in done.items() if v}
