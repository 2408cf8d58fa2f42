"""ONNX export of a policy's chunk planner (observation encoder + the whole chunk computation, a diffusion policy's
DDIM chain unrolled) for deployment, checked against torch before it is kept.

The graph is the policy's ``predict_chunk`` as one static program (:mod:`dmrl.export.graphs` says what each policy
kind puts in it): observations raw with To frames, the instruction as the embedding its LanguageEncoder hands to
fusion, the kind's noise as inputs; the output is the raw chunk (B, Tp, Da). Noise as inputs means the graph has
no random ops and gives the torch policy's numbers for the same noise (the export checks this with onnxruntime
before it keeps the file). B, S, To, L and every image size are fixed at export: static shapes are what ONNX
Runtime, TensorRT and Ascend ATC compile best. Two torch ops are written out in ops ATC documents for opset 18:
Mish as x * tanh(log(1 + exp(x))) and nan_to_num as Equal / Where (see :mod:`dmrl.export.ascend`).

Why a graph at all: at batch 1 the eager loop is dominated by per-op dispatch (about 40 small ops per DDIM step),
which onnxruntime removes; ``benchmarks/export_latency.py`` measures both. The receding-horizon queue stays in
Python (:meth:`ChunkPolicy.act`), with :class:`OnnxPlanner` plugged in through ``ChunkPolicy.set_planner``; the
planner runs the language model once per distinct instruction and caches its embedding.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dmrl.export.ascend import check_ascend, graph_ops
from dmrl.export.graphs import TEXT_INPUTS, ChunkGraph, Spec, input_spec
from dmrl.export.rewrites import ascend_rewrites
from dmrl.policies import ChunkPolicy
from dmrl.types import OBS_MODES

OPSET = 18
TEXT_CACHE = 4096
"""Most instruction embeddings an OnnxPlanner keeps (least recently used are dropped)."""

__all__ = [
    "OPSET",
    "ChunkGraph",
    "ExportReport",
    "OnnxPlanner",
    "example_inputs",
    "export_onnx",
    "graph_ops",
    "input_spec",
]


def example_inputs(spec: Spec, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of ``spec``'s shapes: observations in a plausible range, noise and token embeddings standard
    normal, instruction masks True on a random-length prefix (at least [CLS] and [SEP]) as a tokenizer gives them."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in spec.items():
        if dtype == "uint8":
            out[name] = rng.integers(0, 256, size=shape, dtype=np.uint8)
        elif dtype == "bool":
            lengths = rng.integers(min(2, shape[-1]), shape[-1] + 1, size=shape[:-1])
            out[name] = np.arange(shape[-1]) < lengths[..., None]
        elif name == "depth":
            out[name] = rng.uniform(0.2, 2.0, size=shape).astype(np.float32)
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def noise_names(spec: Spec) -> list[str]:
    """The inputs of ``spec`` that are noise: neither an observation key nor the instruction embedding."""
    return [k for k in spec if k not in OBS_MODES and k not in TEXT_INPUTS]


# Ops ATC documents only up to opset 13 (Softplus, which the exporter's Mish would use) or not at all (Mish,
# IsInf, IsNaN), written out at export in ops it documents for opset 18. The values match torch's to float
# rounding (the export's parity check covers them).
def _mish(x):  # noqa: ANN001, ANN202 (onnxscript traces these with its own value type)
    from onnxscript import opset18 as op

    return op.Mul(x, op.Tanh(op.Log(op.Add(op.Exp(x), op.CastLike(1.0, x)))))


def _nan_to_num(x, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None):  # noqa: ANN001, ANN202
    from onnxscript import opset18 as op

    big = float(torch.finfo(torch.float32).max)
    y = op.Where(op.Equal(x, x), x, op.CastLike(nan, x))  # NaN is the one value unequal to itself
    y = op.Where(op.Equal(y, op.CastLike(float("inf"), x)), op.CastLike(big if posinf is None else posinf, x), y)
    return op.Where(op.Equal(y, op.CastLike(float("-inf"), x)), op.CastLike(-big if neginf is None else neginf, x), y)


def _translations() -> dict:
    return {torch.ops.aten.mish.default: _mish, torch.ops.aten.nan_to_num.default: _nan_to_num}


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Raise a logger to ERROR for a block (the exporter logs every torchvision op it skips, we have none)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@dataclass
class ExportReport:
    path: Path
    inputs: Spec
    max_abs_diff: float
    """Largest |onnxruntime - torch| over the chunk for random inputs: the export's own check."""
    file_mb: float
    ops: dict[str, int]
    """{ONNX op type: count} of the graph (also in the sidecar JSON)."""


def export_onnx(
    policy: ChunkPolicy, path: Path, batch_size: int = 1, atol: float = 1e-4, meta: dict[str, Any] | None = None
) -> ExportReport:
    """Write ``path`` (the graph) and ``path.json`` (its input spec, opset, op list and chunk settings).

    The file appears only after onnxruntime reproduced torch's chunk to ``atol`` on random inputs, so a failed or
    interrupted export leaves whatever was at ``path`` before.
    """
    if batch_size < 1:
        raise ValueError(f"export --batch-size: got {batch_size}; must be >= 1")
    path = Path(path)
    if path.suffix != ".onnx":
        raise ValueError(f"export --out: got {path}; the file name must end in .onnx")
    path.parent.mkdir(parents=True, exist_ok=True)
    policy = policy.cpu().eval()
    graph = ChunkGraph(policy).eval()
    spec = input_spec(policy, batch_size)
    feeds = example_inputs(spec)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial.onnx")
    os.close(fd)
    try:
        with torch.no_grad(), warnings.catch_warnings(), _quiet("torch.onnx"):
            warnings.simplefilter("ignore")  # the exporter's advisory chatter; failures still raise
            torch.onnx.export(
                graph,
                args,
                tmp,
                dynamo=True,
                input_names=list(spec),
                output_names=["chunk"],
                opset_version=OPSET,
                optimize=True,
                verbose=False,
                external_data=False,
                custom_translation_table=_translations(),
            )
            expected = graph(*args).numpy()
        ascend_rewrites(tmp)
        text = getattr(policy.encoder, "text_encoder", None)
        got = OnnxPlanner(Path(tmp), spec=spec, text_encoder=text).run(feeds)
        diff = float(np.abs(got - expected).max())
        if not diff <= atol:
            raise RuntimeError(f"export {path}: onnxruntime differs from torch by {diff:.3g} (> {atol}); file not kept")
        ops = graph_ops(Path(tmp))
        ascend = check_ascend(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    sampler = getattr(policy, "sampler", None)
    sidecar = {
        "policy": policy.name,
        "inputs": {k: {"shape": list(s), "dtype": d} for k, (s, d) in spec.items()},
        "output": {"chunk": [batch_size, policy.chunk.horizon, policy.action_dim]},
        "noise_inputs": noise_names(spec),
        "obs_keys": list(policy.chunk.obs_keys),
        "n_obs_steps": policy.chunk.n_obs_steps,
        "n_action_steps": policy.chunk.n_action_steps,
        "num_inference_steps": sampler.num_steps if sampler is not None else None,
        "stochastic": bool(sampler.stochastic) if sampler is not None else False,
        "opset": OPSET,
        "ops": ops,
        "max_abs_diff": diff,
        "ascend_atc": {
            "ok": ascend.ok,
            "unsupported": ascend.unsupported,
            "unverified": ascend.unverified,
            "dynamic_shapes": ascend.dynamic,
        },
        "meta": meta or {},
    }
    Path(f"{path}.json").write_text(json.dumps(sidecar, indent=2))
    return ExportReport(path, spec, diff, path.stat().st_size / 2**20, ops)


class OnnxPlanner:
    """An exported chunk graph run by onnxruntime: ``planner(obs {key: (B, To, ...)}) -> chunk (B, Tp, Da)``.

    Plug it into a policy with ``policy.set_planner(planner)``: ``act`` keeps its history and action queue and
    asks the graph for each new chunk. Rows are run one graph batch at a time (a batch-1 graph serves any B).
    Noise comes from this planner's own generator, so runs are reproducible for a given ``seed``.
    ``text_encoder``: for a graph that reads an instruction, the policy's LanguageEncoder
    (``policy.encoder.text_encoder``); it embeds each distinct instruction once and the planner caches the result.
    """

    def __init__(
        self,
        path: Path,
        spec: Spec | None = None,
        threads: int = 1,
        seed: int = 0,
        text_encoder: nn.Module | None = None,
    ) -> None:
        import onnxruntime as ort

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"onnx model {path}: no such file (make one with `dmrl export`)")
        if spec is None:
            side = Path(f"{path}.json")
            if not side.is_file():
                raise FileNotFoundError(f"onnx model {path}: missing {side.name} (written by `dmrl export` beside it)")
            spec = {k: (tuple(v["shape"]), v["dtype"]) for k, v in json.loads(side.read_text())["inputs"].items()}
        self.reads_text = TEXT_INPUTS[0] in spec
        if self.reads_text and text_encoder is None:
            raise ValueError(
                f"onnx model {path}: it reads an instruction embedding; pass text_encoder= the checkpoint's "
                "LanguageEncoder (policy.encoder.text_encoder)"
            )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        # ORT's defaults, said outright: every graph rewrite (constant folding, Gemm/LayerNorm fusions), one node at
        # a time. The file stays the Ascend-safe graph; these only change how onnxruntime runs it.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.log_severity_level = 3  # ORT warns about ops it cannot constant-fold: not actionable
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.spec = spec
        self.noise = noise_names(spec)
        tensor_keys = [k for k in spec if k not in self.noise and k not in TEXT_INPUTS]
        self.obs_keys = [*tensor_keys, "instruction"] if self.reads_text else tensor_keys
        self._dtypes = {k: np.dtype(spec[k][1]) for k in tensor_keys}
        self.batch = next(iter(spec.values()))[0][0]
        self.rng = np.random.default_rng(seed)
        self.text_encoder = text_encoder
        self._text_cache: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Raw session call on a full feed dict (shapes exactly as the spec)."""
        return self.session.run(["chunk"], feeds)[0]

    def embed(self, instructions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """B strings -> (instruction_tokens (B, L, D_text) float32, instruction_mask (B, L) bool), from the cache
        or one text-encoder call for the strings not seen yet."""
        new = [s for s in dict.fromkeys(instructions) if s not in self._text_cache]
        if new:
            assert self.text_encoder is not None
            with torch.inference_mode():
                tokens, mask = self.text_encoder(new)
            for i, s in enumerate(new):
                self._text_cache[s] = (tokens[i].float().cpu().numpy(), mask[i].bool().cpu().numpy())
        rows = []
        for s in instructions:
            self._text_cache.move_to_end(s)
            rows.append(self._text_cache[s])
        while len(self._text_cache) > TEXT_CACHE:
            self._text_cache.popitem(last=False)
        return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])

    def _noise(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``feeds`` plus a fresh draw of every noise input (float64 draws cast down: the stream of earlier
        versions, so a seed gives the same chunks as before)."""
        for name in self.noise:
            feeds[name] = self.rng.standard_normal(self.spec[name][0]).astype(np.float32)
        return feeds

    def __call__(self, obs: dict[str, Tensor | list[str]]) -> Tensor:
        missing = [k for k in self.obs_keys if k not in obs]
        if missing:
            raise KeyError(f"onnx planner: obs lacks {missing[0]!r}; the graph needs {self.obs_keys}")
        arrays = {k: _as_array(obs[k], dtype) for k, dtype in self._dtypes.items()}
        if self.reads_text:
            arrays["instruction_tokens"], arrays["instruction_mask"] = self.embed(list(obs["instruction"]))
        b, g = len(next(iter(arrays.values()))), self.batch
        if b == g:  # a robot's decision: the rows are the graph's batch, nothing to slice, pad or concatenate
            return torch.from_numpy(self.run(self._noise(arrays)))
        out = []
        for start in range(0, b, g):
            rows = {k: v[start : start + g] for k, v in arrays.items()}
            n = len(next(iter(rows.values())))
            if n < g:  # pad the last rows up to the graph's static batch, drop them after
                rows = {k: np.concatenate([v, np.repeat(v[-1:], g - n, axis=0)]) for k, v in rows.items()}
            out.append(self.run(self._noise(rows))[:n])
        return torch.from_numpy(np.concatenate(out))


def _as_array(x: Tensor | np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A CPU tensor or array as a C-contiguous array of ``dtype``, copied only when it is not one already
    (onnxruntime reads it during run() and keeps no reference)."""
    a = x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)
    return a if a.dtype == dtype and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=dtype)
