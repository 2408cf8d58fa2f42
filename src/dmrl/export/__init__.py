"""Deployment: the policy alone, as a static ONNX graph (encoder + the chunk computation) run by onnxruntime, and
checked against the operators Ascend's ATC compiler documents."""

from dmrl.export.ascend import AscendReport, check_ascend
from dmrl.export.graphs import GRAPH_KINDS, ChunkGraph, input_spec, register_graph
from dmrl.export.onnx import ExportReport, OnnxPlanner, export_onnx

__all__ = [
    "GRAPH_KINDS",
    "AscendReport",
    "ChunkGraph",
    "ExportReport",
    "OnnxPlanner",
    "check_ascend",
    "export_onnx",
    "input_spec",
    "register_graph",
]
