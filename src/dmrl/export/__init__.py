"""Deployment: the policy alone, as a static ONNX graph (encoder + unrolled DDIM chain) run by onnxruntime."""

from dmrl.export.onnx import ChunkGraph, ExportReport, OnnxPlanner, export_onnx, input_spec

__all__ = ["ChunkGraph", "ExportReport", "OnnxPlanner", "export_onnx", "input_spec"]
