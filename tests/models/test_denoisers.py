"""Contract tests over every registered denoiser: shapes, gradients, determinism, masking, validation, a tiny fit."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dmrl.models import DENOISERS, build_denoiser
from dmrl.models.denoisers import DenoiserConfig

DA, D, K = 3, 16, 5
# Small sizes keep the whole file at a few seconds on two cores; the defaults are covered by test_default_configs.
SMALL: dict[str, dict[str, object]] = {
    "mlp": {"hidden_dim": 32, "n_blocks": 2},
    "unet": {"down_dims": (8, 16, 32), "n_groups": 4, "kernel_size": 3},
    "transformer": {"d_model": 32, "n_layers": 2, "n_heads": 4, "mlp_ratio": 2},
}
NAMES = list(DENOISERS)


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors: one thread avoids OpenMP barriers, which stall for seconds when other jobs share the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make(name: str, horizon: int = 8, out_mult: int = 1, seed: int = 0, **extra: object) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = {**SMALL[name], **extra}
    return build_denoiser(name, action_dim=DA, horizon=horizon, cond_dim=D, out_mult=out_mult, time_dim=8, **cfg)


def perturb_head(model: torch.nn.Module) -> torch.nn.Module:
    """Give the zero-initialised output layer random weights so gradients and outputs depend on every layer."""
    with torch.no_grad():
        model.head.weight.normal_(0.0, 0.5)
        model.head.bias.normal_(0.0, 0.5)
    return model


def assert_near(a: torch.Tensor, b: torch.Tensor, atol: float) -> None:
    # Plain max-abs check: torch.testing's first call costs ~0.7 s of imports on these machines.
    err = (a - b).abs().max().item()
    assert err <= atol, f"max abs difference {err:.3g} > {atol}"


def inputs(b: int, horizon: int = 8, tokens: bool = True, seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, horizon, DA, generator=g)
    t = torch.randint(0, 100, (b,), generator=g)
    cond = torch.randn(b, K, D, generator=g) if tokens else torch.randn(b, D, generator=g)
    return x, t, cond


def test_registry_names() -> None:
    assert set(DENOISERS) == {"mlp", "unet", "transformer"}
    assert set(SMALL) == set(DENOISERS)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("tokens", [False, True], ids=["vector", "tokens"])
@pytest.mark.parametrize("out_mult", [1, 2])
@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("horizon", [16, 8])
def test_output_shape(name: str, tokens: bool, out_mult: int, b: int, horizon: int) -> None:
    model = make(name, horizon=horizon, out_mult=out_mult).eval()
    x, t, cond = inputs(b, horizon, tokens)
    with torch.no_grad():
        out = model(x, t, cond)
    assert out.shape == (b, horizon, DA * out_mult)
    assert torch.all(out == 0), "zero-initialised head must give a zero first prediction"


@pytest.mark.parametrize("name", NAMES)
def test_default_configs(name: str) -> None:
    model = build_denoiser(name, action_dim=6).eval()
    assert (model.config.horizon, model.config.cond_dim) == (16, 256)
    with torch.no_grad():
        out = model(torch.randn(2, 16, 6), torch.tensor([0, 99]), torch.randn(2, 256))
    assert out.shape == (2, 16, 6)
    assert not any("freqs" in key or "phase" in key for key in model.state_dict()), "derived buffers stay out"


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_all_parameters(name: str) -> None:
    model = perturb_head(make(name, out_mult=2)).train()
    x, t, cond = inputs(3)
    mask = torch.tensor([[True] * K, [True, False, True, False, True], [False] * (K - 1) + [True]])
    model(x, t.float(), cond, mask).square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0)]
    assert not missing, f"no gradient for {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_eval_is_deterministic(name: str) -> None:
    extra = {"dropout": 0.2} if name == "transformer" else {}
    model = perturb_head(make(name, **extra)).eval()
    x, t, cond = inputs(3)
    with torch.no_grad():
        assert torch.equal(model(x, t, cond), model(x, t, cond))


@pytest.mark.parametrize("name", NAMES)
def test_batch_independence(name: str) -> None:
    model = perturb_head(make(name)).eval()
    x, t, cond = inputs(3)
    x2, t2, cond2 = inputs(3, seed=7)
    x2[0], t2[0], cond2[0] = x[0], t[0], cond[0]
    with torch.no_grad():
        a, b = model(x, t, cond), model(x2, t2, cond2)
    assert_near(a[0], b[0], 1e-6)
    assert not torch.allclose(a[1:], b[1:])


@pytest.mark.parametrize("name", NAMES)
def test_cond_mask_is_honoured_exactly(name: str) -> None:
    model = perturb_head(make(name)).eval()
    x, t, cond = inputs(3)
    mask = torch.tensor([[True, False, True, False, False], [False] * K, [True] * K])
    junk = cond.clone()
    junk[~mask] = torch.randn(int((~mask).sum()), D) * 1e4
    junk[0, 1, 0] = float("nan")
    with torch.no_grad():
        ref, out = model(x, t, cond, mask), model(x, t, junk, mask)
        unmasked = model(x, t, cond)
    assert torch.isfinite(ref).all(), "a sample with every token masked must still give finite output"
    assert torch.equal(ref, out)
    assert not torch.allclose(ref[0], unmasked[0]), "the mask must change what the model sees"
    assert_near(ref[2], unmasked[2], 1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_vector_cond_equals_one_token_and_scalar_t(name: str) -> None:
    model = perturb_head(make(name)).eval()
    x, t, cond = inputs(2, tokens=False)
    with torch.no_grad():
        assert_near(model(x, t, cond), model(x, t, cond[:, None]), 1e-6)
        t_same = torch.full((2,), 7)
        assert torch.equal(model(x, t_same, cond), model(x, torch.tensor(7), cond))
        assert torch.equal(model(x, t_same, cond), model(x, 7, cond))


@pytest.mark.parametrize("attn_fp32", [False, True])
def test_transformer_under_bf16_autocast(attn_fp32: bool) -> None:
    model = perturb_head(make("transformer", attn_fp32=attn_fp32)).eval()
    x, t, cond = inputs(2)
    mask = torch.tensor([[True, True, False, False, False], [True] * K])
    with torch.no_grad():
        ref = model(x, t, cond, mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x, t, cond, mask)
    assert torch.isfinite(out).all()
    assert_near(out.float(), ref, 0.1)


def test_no_einsum_in_models() -> None:
    root = Path(__file__).resolve().parents[2] / "src" / "dmrl" / "models"
    offenders = [p.name for p in root.rglob("*.py") if re.search(r"einsum\s*\(", p.read_text())]
    assert not offenders, f"einsum found in {offenders} (DESIGN.md rule 11: use matmul / SDPA)"


BAD_CONFIGS = [
    ("mlp", {"action_dim": 0}),
    ("mlp", {"action_dim": 3, "out_mult": 3}),
    ("mlp", {"action_dim": 3, "time_dim": 7}),
    ("mlp", {"action_dim": 3, "hidden_dim": 0}),
    ("unet", {"action_dim": 3, "horizon": 6}),
    ("unet", {"action_dim": 3, "down_dims": (64, 100)}),
    ("unet", {"action_dim": 3, "down_dims": ()}),
    ("unet", {"action_dim": 3, "kernel_size": 4}),
    ("transformer", {"action_dim": 3, "d_model": 30, "n_heads": 4}),
    ("transformer", {"action_dim": 3, "dropout": 1.5}),
    ("transformer", {"action_dim": 3, "n_layers": 0}),
    ("nope", {"action_dim": 3}),
    ("mlp", {"action_dim": 3, "widht": 64}),
]


@pytest.mark.parametrize(("name", "cfg"), BAD_CONFIGS, ids=[f"{n}-{sorted(c)[-1]}" for n, c in BAD_CONFIGS])
def test_config_errors_are_one_line(name: str, cfg: dict[str, object]) -> None:
    with pytest.raises(ValueError) as info:
        build_denoiser(name, **cfg)
    message = str(info.value)
    assert "\n" not in message and ("got" in message or "known" in message or "allowed" in message), message


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="known: mlp, unet, transformer"):
        build_denoiser("diffusion_transformer", action_dim=3)


def test_configs_share_the_base() -> None:
    for cls in DENOISERS.values():
        assert issubclass(cls.config_cls, DenoiserConfig)
    cfg = build_denoiser("unet", action_dim=3, down_dims=[8, 16], n_groups=8).config
    assert cfg.down_dims == (8, 16), "a list from YAML becomes a tuple"


@pytest.mark.parametrize("name", NAMES)
def test_wrong_input_shapes_raise_one_line(name: str) -> None:
    model = make(name)
    x, t, cond = inputs(2)
    bad_calls = [
        (x[:, :4], t, cond, None),
        (x, t[:1], cond, None),
        (x, t, cond[..., :4], None),
        (x, t, cond[:, 0], torch.ones(2, K, dtype=torch.bool)),
        (x, t, cond, torch.ones(2, K)),
    ]
    for args in bad_calls:
        with pytest.raises(ValueError) as info:
            model(*args)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_overfits_a_fixed_target(name: str) -> None:
    model = make(name, out_mult=2, seed=3).train()
    x, t, cond = inputs(4)
    target = torch.randn(4, 8, 2 * DA, generator=torch.Generator().manual_seed(5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = last = None
    for _ in range(200):
        loss = (model(x, t, cond) - target).square().mean()
        first = loss.item() if first is None else first
        last = loss.item()
        if last < first / 10:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert last < first / 10, f"{name}: loss {first:.3f} -> {last:.3f} in 200 steps"
