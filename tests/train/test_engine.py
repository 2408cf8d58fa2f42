"""The training engine's pieces: devices, precision, loss scaling, accumulation, checkpointing, batch sharding."""

from __future__ import annotations

import warnings

import pytest
import torch

from dmrl.models import build_denoiser
from dmrl.policies import POLICIES, ChunkConfig, build_policy
from dmrl.train.engine import (
    DistInfo,
    Engine,
    EngineConfig,
    GlobalBatchSampler,
    compile_submodules,
    resolve_device,
    resolve_precision,
    set_grad_checkpointing,
)
from dmrl.train.engine.core import split_batch


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _batch(b: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": {"state": torch.randn(b, 2, 5, generator=g)},
        "action": torch.rand(b, 16, 3, generator=g) * 2 - 1,
        "action_mask": torch.ones(b, 16, dtype=torch.bool),
    }


def _slice(batch: dict, sl: slice) -> dict:
    return {k: _slice(v, sl) if isinstance(v, dict) else v[sl] for k, v in batch.items()}


def _gaussian(seed: int = 0):
    torch.manual_seed(seed)
    return build_policy("gaussian", ChunkConfig(), POLICIES["gaussian"][1](hidden=32, depth=2), {"state": 5}, 3)


def test_devices_resolve_and_bad_names_fail_in_one_line():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda", "npu")
    for bad, match in [("tpu", "allowed: auto, cpu"), ("cuda:x", "allowed"), ("npu", "torch_npu")]:
        try:
            import torch_npu  # noqa: F401

            if bad == "npu":
                continue
        except ImportError:
            pass
        with pytest.raises(ValueError, match=match) as e:
            resolve_device(bad)
        assert "\n" not in str(e.value)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_precision_defaults_and_checks(monkeypatch):
    from dmrl.train.engine import device as device_mod

    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "fp32"
    with pytest.raises(ValueError, match="allowed: auto, fp32, bf16, fp16"):
        resolve_precision("fp8", cpu)
    monkeypatch.setattr(device_mod, "cpu_has_native", lambda p: False)
    with pytest.warns(UserWarning, match="far slower"):
        assert resolve_precision("bf16", cpu) == "bf16"
    monkeypatch.setattr(device_mod, "cpu_has_native", lambda p: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU with native bf16 (AVX512-BF16 / AMX) gets no warning
        assert resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(ValueError, match="--engine.precision"):
        EngineConfig(precision="half")


def test_accumulation_equals_one_larger_batch():
    """k micro-batches of b accumulate to the gradient of one batch of k*b (deterministic Gaussian loss)."""
    batch = _batch(16)
    grads = []
    for acc in (1, 4):
        policy = _gaussian()
        engine = Engine(EngineConfig(device="cpu", accumulate=acc, grad_clip=0.0))
        module = engine.prepare(policy)
        for k in range(acc):
            n = 16 // acc
            engine.forward_backward(module, _slice(batch, slice(k * n, (k + 1) * n)), last=k == acc - 1)
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


def test_backward_splits_a_batch_into_accumulate_micro_batches():
    """Engine.backward over one batch of 16 with accumulate 4 gives the gradients of four manual micro-batches."""
    batch = _batch(16)
    grads, logs = [], []
    for manual in (True, False):
        policy = _gaussian()
        engine = Engine(EngineConfig(device="cpu", accumulate=4, grad_clip=0.0))
        module = engine.prepare(policy)
        if manual:
            out = [
                engine.forward_backward(module, _slice(batch, slice(4 * k, 4 * k + 4)), last=k == 3) for k in range(4)
            ]
            logs.append(sum(o["loss"].detach() for o in out) / 4)
        else:
            logs.append(engine.backward(module, batch)["loss"])
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    assert torch.equal(grads[0], grads[1])
    torch.testing.assert_close(logs[0], logs[1])
    parts = split_batch({"x": torch.arange(6), "names": list("abcdef"), "progress": 0.5, "bc": None}, 3)
    assert [p["x"].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]] and parts[2]["names"] == ["e", "f"]
    assert all(p["progress"] == 0.5 and p["bc"] is None for p in parts)
    with pytest.raises(ValueError, match="batch key 'x': 6 items do not split into --engine.accumulate 4"):
        split_batch({"x": torch.arange(6)}, 4)


def test_clipping_reports_the_pre_clip_norm_and_bounds_the_update():
    policy = _gaussian()
    engine = Engine(EngineConfig(device="cpu", grad_clip=1e-3))
    module = engine.prepare(policy)
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    before = [p.detach().clone() for p in policy.parameters()]
    engine.forward_backward(module, _batch(8))
    stats = engine.step(opt)
    assert float(stats["grad_norm"]) > 1e-3 and not stats["skipped"]
    step = torch.cat([(p.detach() - b).flatten() for p, b in zip(policy.parameters(), before, strict=True)])
    assert float(step.norm()) == pytest.approx(1e-3, rel=1e-3)  # SGD lr 1: the update is the clipped gradient
    assert all(p.grad is None for p in policy.parameters())


def test_fp16_loss_scaler_skips_nonfinite_steps_and_halves_the_scale():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU may lack native fp16: slow but correct, fine for this test
        engine = Engine(EngineConfig(device="cpu", precision="fp16"))
    assert engine.scaler.is_enabled() and engine.scaler.get_scale() == 2.0**15
    assert engine.scaler.get_growth_interval() == 2000 and engine.scaler.get_backoff_factor() == 0.5
    lin = torch.nn.Linear(4, 1)
    engine.prepare(lin)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    before = lin.weight.detach().clone()
    engine.scaler.scale(lin(torch.full((2, 4), float("inf"))).sum()).backward()
    stats = engine.step(opt)
    assert stats["skipped"] and engine.scaler.get_scale() == 2.0**14
    assert torch.equal(lin.weight, before)  # the step was skipped, not applied with inf
    out = engine.forward_backward(lambda b: {"loss": lin(b).sum()}, torch.ones(2, 4))
    stats = engine.step(opt)
    assert torch.isfinite(out["loss"]) and not stats["skipped"] and not torch.equal(lin.weight, before)


@pytest.mark.parametrize("name", ["mlp", "unet", "transformer"])
def test_grad_checkpointing_gives_the_same_gradients(name):
    torch.manual_seed(0)
    net = build_denoiser(name, action_dim=3, horizon=8, cond_dim=16)
    torch.nn.init.normal_(net.head.weight, std=0.1)  # a zero head would make most gradients zero
    x, t, cond = torch.randn(4, 8, 3), torch.randint(0, 100, (4,)), torch.randn(4, 16)
    grads = []
    for on in (False, True):
        assert set_grad_checkpointing(net, on) >= 1
        net.zero_grad()
        net(x, t, cond).square().sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


def test_grad_checkpointing_switch_reaches_every_policy():
    for name in POLICIES:
        policy = build_policy(name, ChunkConfig(), POLICIES[name][1](), {"state": 5}, 3)
        assert set_grad_checkpointing(policy, True) >= 1, name


def test_compile_keeps_state_dict_keys():
    policy = _gaussian()
    keys = list(policy.state_dict())
    assert compile_submodules(policy) == ["encoder", "head"]
    assert list(policy.state_dict()) == keys  # checkpoints stay loadable by an eager model


def test_global_batches_are_sharded_exactly_across_ranks_and_micro_batches():
    single = iter(GlobalBatchSampler(100, 24, 1, DistInfo(), seed=3))
    ranks = [iter(GlobalBatchSampler(100, 24, 3, DistInfo(r, 2, r), seed=3)) for r in range(2)]
    for _ in range(9):  # past one epoch (4 steps of 24 out of 100): reshuffled, tail dropped
        whole = next(single)
        parts = [next(it) for it in ranks]  # each rank's share of the step; the engine splits it into 3 of 4
        assert all(len(p) == 12 for p in parts) and sum(parts, []) == whole
    resumed = iter(GlobalBatchSampler(100, 24, 1, DistInfo(), seed=3, start_step=6))
    fresh = iter(GlobalBatchSampler(100, 24, 1, DistInfo(), seed=3))
    assert next(resumed) == [next(fresh) for _ in range(7)][-1]


def test_batch_size_must_split_over_ranks_and_micro_batches():
    with pytest.raises(ValueError, match="divisible by accumulate x ranks = 4 x 2"):
        GlobalBatchSampler(100, 30, 4, DistInfo(0, 2, 0), seed=0)
    with pytest.raises(ValueError, match="exceeds the 10 training windows"):
        GlobalBatchSampler(10, 16, 1, DistInfo(), seed=0)
