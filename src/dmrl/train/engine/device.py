"""Devices, precision and seeding: the only code in dmrl that knows device names (DESIGN rule 11).

Everything else receives a ``torch.device`` and an autocast context from here and never branches on the
device kind. Ascend NPUs are reached through ``torch_npu``, which registers the ``npu`` device type with
torch, so the same calls (``torch.autocast("npu")``, ``torch.amp.GradScaler("npu")``) work there.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import warnings
from collections.abc import Iterator

import numpy as np
import torch

DEVICE_KINDS = ("cpu", "cuda", "npu")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DDP_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


def _npu_available() -> bool:
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError:
        return False
    return bool(torch.npu.is_available())  # type: ignore[attr-defined]


def _require_npu(name: str) -> None:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        raise ValueError(
            f"--engine.device {name}: torch_npu is not installed; pip install '.[npu]' with the torch_npu build "
            "matching your CANN (README, 'Ascend NPU'), or use --engine.device cpu|cuda|auto"
        ) from None
    if not torch.npu.is_available():  # type: ignore[attr-defined]
        raise ValueError(f"--engine.device {name}: torch_npu found no NPU (check ASCEND_RT_VISIBLE_DEVICES and CANN)")


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """``auto`` (NPU > CUDA > CPU), ``cpu``, ``cuda[:i]`` or ``npu[:i]`` -> torch.device; unknown names raise.

    Under torchrun (``local_rank`` given) a bare ``cuda``/``npu``/``auto`` means this rank's own device,
    index ``local_rank`` among the visible ones (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES apply).
    """
    if name == "auto":
        name = "npu" if _npu_available() else "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = name.partition(":")
    if kind not in DEVICE_KINDS or (index and not index.isdigit()):
        raise ValueError(f"--engine.device: got {name!r}; allowed: auto, cpu, cuda[:i], npu[:i]")
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--engine.device {name}: CUDA is not available on this machine; use cpu or auto")
    if kind == "npu":
        _require_npu(name)
    module = getattr(torch, kind)
    i = int(index) if index else (local_rank or 0)
    if i >= module.device_count():
        raise ValueError(f"--engine.device {kind}:{i}: only {module.device_count()} {kind} device(s) visible")
    module.set_device(i)  # NCCL/HCCL and the default stream follow the current device
    return torch.device(kind, i)


def cpu_has_native(precision: str) -> bool:
    """Whether this CPU computes ``precision`` natively (oneDNN: AVX512-BF16 / AMX for bf16, AVX512-FP16 / AMX-FP16
    for fp16). Without it autocast emulates the type and is far slower than fp32."""
    check = {"bf16": "_is_mkldnn_bf16_supported", "fp16": "_is_mkldnn_fp16_supported"}.get(precision)
    if check is None:
        return True
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):  # a private oneDNN query: assume the slow case if it is gone
        return False


def resolve_precision(name: str, device: torch.device) -> str:
    """``auto`` -> fp32 on CPU, bf16 on CUDA where supported else fp16, fp16 on NPU; checks explicit choices.

    CPU defaults to fp32: it is exact, and on CPUs without native bf16/fp16 autocast is emulated and far slower
    (~17x on the project's reference machines). Asking for it on such a CPU warns instead of failing, since the
    result is still correct. Where the CPU has it natively (this project's 2-core AMD EPYC VMs have AVX512-BF16),
    bf16 is allowed silently; measured there, a bf16 training step took 0.66-1.17x the fp32 time
    (benchmarks/results/engine_precision.md).
    """
    if name not in PRECISIONS:
        raise ValueError(f"--engine.precision: got {name!r}; allowed: {', '.join(PRECISIONS)}")
    kind = device.type
    if name == "auto":
        if kind == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "fp16" if kind == "npu" else "fp32"
    if kind == "cpu" and not cpu_has_native(name):
        warnings.warn(
            f"--engine.precision {name} on CPU: this CPU has no native {name}, so autocast emulates it and is "
            "far slower than fp32 (~17x on such machines); use fp32",
            stacklevel=2,
        )
    if kind == "cuda" and name == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--engine.precision bf16: {torch.cuda.get_device_name(device)} has no bf16; use fp16")
    if kind == "cuda" and name == "fp16" and torch.cuda.get_device_capability(device) < (6, 0):
        raise ValueError("--engine.precision fp16: this GPU has no fast fp16 (compute capability < 6.0); use fp32")
    return name


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """Mixed precision for the forward pass: matmuls/convs in bf16/fp16, while autocast's own fp32 list keeps
    softmax, layer/group norm, exp/log and reductions in fp32 (weights stay fp32, unlike an all-fp16 "O2" model).
    Losses are computed from fp32 casts of the outputs by the policies. fp32: a no-op."""
    if precision == "fp32":
        yield
        return
    with torch.autocast(device_type=device.type, dtype=DTYPES[precision]):
        yield


@contextlib.contextmanager
def fork_rng(device: torch.device) -> Iterator[None]:
    """Draw from torch's RNG (CPU and ``device``) inside the block without moving the streams outside it."""
    devices = [device] if device.type != "cpu" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        yield


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (every device) from one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_deterministic(on: bool) -> None:
    """Deterministic kernels (needed for bit-exact resume on GPU; CPU kernels at a fixed thread count are)."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on, warn_only=False)
    torch.backends.cudnn.benchmark = not on
    torch.backends.cudnn.deterministic = on


def configure_cpu_threads(n: int) -> None:
    """Intra-op threads for CPU math. Default 1: the models here are small, and with 2+ threads on a 2-core
    machine any other busy process (env workers, a second trainer) makes OpenMP threads spin-wait; measured
    here: diffusion BC at batch 256 ran 21.6 ms/step with 1 thread and 425 ms/step with 2 under load."""
    if n < 1:
        raise ValueError(f"--engine.cpu-threads: got {n}; must be >= 1")
    torch.set_num_threads(n)


def rng_state() -> dict:
    """Every RNG a training step draws from (python, numpy, torch CPU, the accelerator's), for exact resume."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    for kind in ("cuda", "npu"):
        module = getattr(torch, kind, None)
        if module is not None and kind != "cpu" and _initialised(kind):
            state[kind] = module.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    for kind in ("cuda", "npu"):
        if kind in state and _initialised(kind):
            getattr(torch, kind).set_rng_state_all(state[kind])


def _initialised(kind: str) -> bool:
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_initialized()
    return "torch_npu" in sys.modules and torch.npu.is_available()  # type: ignore[attr-defined]
