"""Deployment: the policy alone, as a static ONNX graph (encoder + the chunk computation) run by onnxruntime."""

from dmrl.export.graphs import GRAPH_KINDS, ChunkGraph, input_spec, register_graph
from dmrl.export.onnx import ExportReport, OnnxPlanner, export_onnx

__all__ = ["GRAPH_KINDS", "ChunkGraph", "ExportReport", "OnnxPlanner", "export_onnx", "input_spec", "register_graph"]
