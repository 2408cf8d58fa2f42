"""Multimodal observation encoder: shapes, exact masking, gradients, pretrained ViT loading, modality dropout."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dmrl.models.depth import DepthConfig, DepthEncoder
from dmrl.models.fusion import ConcatFusion, PerceiverConfig, PerceiverFusion
from dmrl.models.multimodal import (
    MODALITIES,
    MultimodalEncoder,
    MultimodalEncoderConfig,
    MultimodalExperimental,
    MultimodalGeometry,
    drop_modalities,
)
from dmrl.models.resnet import ResNet18GN, ResNetGNConfig
from dmrl.models.tokens import FrameTokenizer, ProprioTokenizer
from dmrl.models.vit import ViTConfig, ViTEncoder

B, TO, D, K, HW = 3, 2, 32, 4, (32, 32)
TINY_VIT = {"width": 32, "depth": 2, "n_heads": 2, "patch_size": 8}  # 16 patch tokens per 32 x 32 frame
TINY_DEPTH = DepthConfig(width=16, depth=1, n_heads=2, patch_size=16)
TINY_RESNET = ResNetGNConfig(widths=(8, 8, 16, 16), n_keypoints=5)
SUBSETS = [s for r in range(1, len(MODALITIES) + 1) for s in itertools.combinations(MODALITIES, r)]


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors: one thread avoids OpenMP barriers, which stall for seconds when other jobs share the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class FakeText(nn.Module):
    """Stand-in for models.language.LanguageEncoder: list[str] -> (tokens (B, 6, 24), mask (B, 6)), word hashing."""

    out_dim = 24

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, self.out_dim)

    def forward(self, instructions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.zeros(len(instructions), 6, dtype=torch.long)
        for i, text in enumerate(instructions):
            for j, word in enumerate(text.split()[:6]):
                ids[i, j] = sum(map(ord, word)) % 63 + 1
        return self.embed(ids), ids > 0


def make_encoder(modalities=MODALITIES, seed: int = 0, vit: dict | None = None, **extra) -> MultimodalEncoder:
    torch.manual_seed(seed)
    kw = dict(
        dim=D,
        vit=ViTConfig(**{**TINY_VIT, **(vit or {})}),
        resnet=TINY_RESNET,
        depth=TINY_DEPTH,
        perceiver=PerceiverConfig(n_latents=K, n_heads=2, n_layers=1),
        concat_hidden=32,
        proprio_skip=True,  # both off by default (older checkpoints); the tests cover them on
        instruction_queries=True,
    )
    cfg = MultimodalEncoderConfig(**(kw | extra))
    geometry = MultimodalGeometry(tuple(modalities), n_obs_steps=TO, image_size=HW)
    return MultimodalEncoder(cfg, geometry, FakeText() if "instruction" in modalities else None)


def make_obs(b: int = B, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "rgb": torch.randint(0, 256, (b, TO, 3, *HW), dtype=torch.uint8, generator=g),
        "depth": torch.rand(b, TO, 1, *HW, generator=g) * 2.5,
        "joints": torch.randn(b, TO, 6, generator=g),
        "force": torch.randn(b, TO, 4, generator=g),
        "instruction": ["pick the red cup", "pick the blue cup please", "go"][:b],
    }


# --------------------------------------------------------------------------- per-modality encoders


@pytest.mark.parametrize("n_cams", [1, 2])
def test_image_encoders_shapes(n_cams: int) -> None:
    rgb = torch.randint(0, 256, (B, 3 * n_cams, *HW), dtype=torch.uint8)
    vit = ViTEncoder(ViTConfig(**TINY_VIT), out_dim=D, image_size=HW, n_cameras=n_cams)
    res = ResNet18GN(TINY_RESNET, out_dim=D, image_size=HW, n_cameras=n_cams)
    dep = DepthEncoder(TINY_DEPTH, out_dim=D, image_size=HW, n_cameras=n_cams)
    assert vit(rgb).shape == (B, n_cams * 16, D) and vit.n_tokens == n_cams * 16
    assert res(rgb).shape == (B, n_cams * 5, D) and res.n_tokens == n_cams * 5
    assert dep(torch.rand(B, n_cams, *HW)).shape == (B, n_cams * 4, D) and dep.n_tokens == n_cams * 4
    with pytest.raises(ValueError, match=r"expected \(B, \(6, 32, 32\)\)"):
        ViTEncoder(ViTConfig(**TINY_VIT), out_dim=D, image_size=HW, n_cameras=2)(rgb[:, :3])


def test_spatial_softmax_keypoints_are_expectations() -> None:
    res = ResNet18GN(ResNetGNConfig(widths=(8, 8, 16, 16), n_keypoints=3, stem_pool=False), out_dim=D, image_size=HW)
    assert res.keypoints.grid.shape == (4, 2)  # 32 / 2**4 = 2: a 2 x 2 map
    xy = res.keypoints(torch.randn(2, 16, 2, 2))
    assert xy.shape == (2, 3, 2) and xy.abs().max() < 0.5  # pixel centres of a 2 x 2 map are at +-0.5
    onehot = torch.full((1, 16, 2, 2), -1e4)
    onehot[..., 1, 0] = 1e4  # all keypoint maps peak at row 1, column 0 when the 1x1 conv is the mean
    with torch.no_grad():
        res.keypoints.conv.weight.fill_(1 / 16)
        res.keypoints.conv.bias.zero_()
    assert torch.allclose(res.keypoints(onehot), torch.tensor([-0.5, 0.5]).expand(1, 3, 2))


def test_depth_encoder_clamps_and_sanitises() -> None:
    enc = DepthEncoder(TINY_DEPTH, out_dim=D, image_size=HW)
    depth = torch.rand(B, 1, *HW)
    far = depth.clone()
    far[..., :4, :] = 2.0
    farther = far.clone()
    farther[..., :4, :] = 50.0
    assert torch.equal(enc(far), enc(farther))  # everything beyond max_depth reads as max_depth
    broken = depth.clone()
    broken[..., 0, 0], broken[..., 1, 1] = float("nan"), float("inf")
    assert torch.isfinite(enc(broken)).all()


def test_proprio_and_frame_tokens() -> None:
    tok = ProprioTokenizer({"joints": 6, "force": 4}, TO, D)
    same = torch.ones(B, TO, 6)
    out = tok("joints", same)
    assert out.shape == (B, TO, D)
    assert not torch.allclose(out[:, 0], out[:, 1])  # the time embedding tells equal frames apart
    assert not torch.allclose(tok("force", torch.zeros(B, TO, 4)), tok("joints", torch.zeros(B, TO, 6)))
    with pytest.raises(ValueError, match=r"expected \(B, \(2, 4\)\)"):
        tok("force", torch.zeros(B, TO, 6))
    frames = FrameTokenizer(ViTEncoder(ViTConfig(**TINY_VIT), out_dim=D, image_size=HW), TO)
    rgb = torch.randint(0, 256, (B, TO, 3, *HW), dtype=torch.uint8)
    assert frames(rgb).shape == (B, TO * 16, D) and frames.n_tokens == TO * 16


# --------------------------------------------------------------------------- fusion and the full encoder


@pytest.mark.parametrize("fusion", ["perceiver", "concat"])
@pytest.mark.parametrize("modalities", SUBSETS, ids=["+".join(s) for s in SUBSETS])
def test_encoder_shapes_every_subset(modalities: tuple[str, ...], fusion: str) -> None:
    enc = make_encoder(modalities, fusion=fusion).eval()
    out = enc(make_obs())
    k = K if fusion == "perceiver" else 1
    assert out.tokens.shape == (B, k, D) and out.mask.shape == (B, k) and out.mask.all()
    assert out.pooled.shape == (B, D) and enc.out_dim == D and torch.isfinite(out.tokens).all()
    assert set(out.present) == set(modalities) and all(v.shape == (B,) and v.all() for v in out.present.values())


@pytest.mark.parametrize("fusion", ["perceiver", "concat"])
def test_masked_tokens_never_leak(fusion: str) -> None:
    torch.manual_seed(0)
    sizes = (5, 3, 4)
    fuse = PerceiverFusion(PerceiverConfig(n_latents=K, n_heads=2), dim=D) if fusion == "perceiver" else None
    fuse = fuse or ConcatFusion(len(sizes), D, hidden=16)
    tokens = [torch.randn(B, n, D) for n in sizes]
    masks = [torch.rand(B, n) < 0.5 for n in sizes]
    masks[1][0] = False  # sample 0 lacks modality 1 altogether
    garbage = [
        torch.where(m[..., None], t, torch.tensor(v)) for t, m, v in zip(tokens, masks, [1e30, -1e30, 0.0], strict=True)
    ]
    garbage[2][~masks[2]] = float("nan")
    garbage[0][~masks[0]] = float("inf")

    def run(ts: list[torch.Tensor], ms: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(fuse, PerceiverFusion):
            return fuse(torch.cat(ts, 1), torch.cat(ms, 1))
        return fuse(list(zip(ts, ms, strict=True)))

    for a, b in zip(run(tokens, masks), run(garbage, masks), strict=True):
        assert torch.equal(a, b)
    nothing = [torch.zeros_like(m) for m in masks]  # every modality masked: no NaN, a learned constant
    empty, _ = run(garbage, nothing)
    assert torch.isfinite(empty).all() and torch.equal(empty, run(tokens, nothing)[0])


@pytest.mark.parametrize("fusion", ["perceiver", "concat"])
def test_missing_key_equals_masked_modality(fusion: str) -> None:
    enc = make_encoder(fusion=fusion).eval()
    obs = make_obs()
    for name in MODALITIES:
        without = enc({k: v for k, v in obs.items() if k != name})
        poisoned = dict(obs)
        if name in ("joints", "force"):
            poisoned[name] = torch.full_like(obs[name], float("nan"))
        masked = enc(poisoned, present={name: torch.zeros(B, dtype=torch.bool)})
        assert not without.present[name].any() and not masked.present[name].any()
        # Equal up to fp32 rounding: a missing instruction is one masked placeholder, a masked one its L masked
        # tokens, so the attention sums run over different lengths (a leak would differ by orders more).
        torch.testing.assert_close(without.tokens, masked.tokens, rtol=0, atol=1e-5)
        # One sample masked: its row equals the run without the modality, the other rows are untouched.
        one = enc(obs, present={name: torch.tensor([True, False, True])})
        full = enc(obs)
        torch.testing.assert_close(one.pooled[1], without.pooled[1], rtol=0, atol=1e-6)
        assert torch.equal(one.pooled[0::2], full.pooled[0::2])


def test_all_modalities_missing_for_a_sample_is_finite() -> None:
    enc = make_encoder(("rgb", "joints")).eval()
    off = torch.tensor([True, False, False])
    out = enc(make_obs(), present={"rgb": off, "joints": off})
    assert torch.isfinite(out.tokens).all() and torch.equal(out.tokens[1], out.tokens[2])
    with pytest.raises(ValueError, match="obs has none of"):
        enc({"state": torch.zeros(B, TO, 3)})


def test_gradients_reach_only_trainable_layers() -> None:
    enc = make_encoder(vit={"freeze": True}).train()
    obs = make_obs()
    poisoned = obs | {"force": torch.full((B, TO, 4), float("nan"))}  # masked NaN must not reach any gradient
    enc(poisoned, present={"force": torch.zeros(B, dtype=torch.bool)}).pooled.square().sum().backward()
    vit = enc.frames["rgb"].encoder
    assert all(p.grad is None and not p.requires_grad for p in vit.backbone.parameters())
    assert vit.head.proj.weight.grad is not None and vit.head.proj.weight.grad.abs().sum() > 0
    force = [p.grad for n, p in enc.named_parameters() if "force" in n]  # its tokenizer and its skip
    assert len(force) == 4 + len(list(enc.skip["force"].parameters()))
    assert force and all(g is None or not g.any() for g in force)  # masked for every sample: exactly zero
    assert all(torch.isfinite(p.grad).all() for p in enc.parameters() if p.grad is not None)
    for name, p in enc.named_parameters():
        if p.requires_grad and "force" not in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name  # text encoder included: it fine-tunes
    trainable = make_encoder(("rgb",))
    trainable(obs).pooled.sum().backward()
    assert all(p.grad is not None for p in trainable.frames["rgb"].encoder.backbone.parameters())


def test_modality_dropout_keeps_one_and_is_off_in_eval() -> None:
    torch.manual_seed(0)
    avail = torch.rand(4000, 5) < 0.7
    avail[:10] = False  # samples with nothing available stay empty
    kept = drop_modalities(avail, 0.9)
    assert not (kept & ~avail).any()
    assert torch.equal(kept.any(1), avail.any(1))
    assert 0.05 < kept.sum() / avail.sum() < 0.35  # mostly dropped, topped up by the keep-one rule
    enc = make_encoder(modality_dropout=0.9)
    obs = make_obs()
    for _ in range(5):
        present = torch.stack(list(enc.train()(obs).present.values()), 1)
        assert present.any(1).all()
    enc.eval()
    out = enc(obs)
    assert all(v.all() for v in out.present.values())
    assert torch.equal(out.tokens, enc(obs).tokens)


def test_instruction_token_dropout_varies_the_instruction_in_training_only() -> None:
    obs = make_obs()
    plain = make_encoder(("joints", "instruction"))
    enc = make_encoder(("joints", "instruction"), instruction_token_dropout=0.5)
    ref = plain.eval()(obs).pooled
    assert torch.equal(plain.train()(obs).pooled, ref)  # nothing else in this encoder is random in training
    torch.manual_seed(3)
    outs = [enc.train()(obs) for _ in range(6)]
    assert all(o.present["instruction"].all() for o in outs)  # every sample keeps at least one token
    # "go" has one token, always kept: that sample never changes; the longer instructions do.
    assert all(torch.allclose(o.pooled[2], ref[2]) for o in outs)
    assert any(not torch.allclose(o.pooled[:2], ref[:2]) for o in outs)
    assert torch.equal(enc.eval()(obs).pooled, ref)  # off in evaluation


@pytest.mark.parametrize("rgb_encoder", ["vit", "resnet"])
def test_grad_checkpointing_gives_same_gradients(rgb_encoder: str) -> None:
    grads = []
    for on in (False, True):
        enc = make_encoder(("rgb", "depth", "joints"), rgb_encoder=rgb_encoder)
        switched = [m for m in enc.modules() if hasattr(m, "grad_checkpointing")]
        assert len(switched) >= 3  # rgb backbone, depth backbone, perceiver
        for m in switched:
            m.grad_checkpointing = on
        enc(make_obs()).pooled.square().sum().backward()
        grads.append([p.grad.clone() for p in enc.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attn_fp32", [False, True])
def test_bf16_autocast_runs(attn_fp32: bool) -> None:
    torch.manual_seed(0)
    cfg = MultimodalEncoderConfig(
        dim=D,
        vit=ViTConfig(**TINY_VIT, attn_fp32=attn_fp32),
        perceiver=PerceiverConfig(n_latents=K, n_heads=2, n_layers=1, attn_fp32=attn_fp32),
    )
    enc = MultimodalEncoder(cfg, MultimodalGeometry(("rgb", "joints"), image_size=HW))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = enc(make_obs())
    assert torch.isfinite(out.pooled.float()).all()


def test_config_errors_are_one_line() -> None:
    bad = [
        lambda: ViTConfig(size="huge"),
        lambda: ViTConfig(width=30, n_heads=4),
        lambda: DepthConfig(max_depth=0.0),
        lambda: ResNetGNConfig(widths=(8, 8, 16)),
        lambda: MultimodalGeometry(modalities=("rgb", "lidar")),
        lambda: MultimodalEncoderConfig(fusion="sum"),
        lambda: MultimodalEncoderConfig(modality_dropout=1.0),
        lambda: MultimodalEncoderConfig(instruction_token_dropout=-0.1),
        lambda: ViTEncoder(ViTConfig(**TINY_VIT), image_size=(30, 32)),
        lambda: MultimodalEncoder(None, MultimodalGeometry(("joints", "instruction"))),
        lambda: MultimodalEncoder(None, MultimodalGeometry(("joints",)), FakeText()),
    ]
    for make in bad:
        with pytest.raises(ValueError) as err:
            make()
        assert "\n" not in str(err.value)
    assert (ViTConfig(size="base").width, ViTConfig(size="base").depth, ViTConfig(size="base").patch_size) == (
        768,
        12,
        16,
    )


def test_default_sizes() -> None:
    assert ViTEncoder().n_tokens == 64  # tiny ViT at 64 x 64, patch 8
    enc = MultimodalEncoder().eval()
    obs = {
        "rgb": torch.zeros(1, 2, 3, 64, 64, dtype=torch.uint8),
        "depth": torch.ones(1, 2, 1, 64, 64),
        "joints": torch.zeros(1, 2, 6),
        "force": torch.zeros(1, 2, 4),
    }
    out = enc(obs)
    assert out.tokens.shape == (1, 32, 256) and out.pooled.shape == (1, 256)


def test_no_einsum_in_src() -> None:
    src = Path(__file__).resolve().parents[2] / "src"
    offenders = [str(p.relative_to(src)) for p in src.rglob("*.py") if re.search("einsum", p.read_text())]
    assert not offenders, f"einsum found in {offenders} (DESIGN.md rule 11: use matmul / SDPA)"


# --------------------------------------------------------------------------- pretrained ViT weights


def timm_state_dict(width: int = 32, depth: int = 2, patch: int = 8, grid: int = 4, seed: int = 0) -> dict:
    """A random state dict with timm ViT's keys and shapes (class token, classifier head included)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    sd = {
        "cls_token": r(1, 1, width),
        "pos_embed": r(1, 1 + grid * grid, width),
        "patch_embed.proj.weight": r(width, 3, patch, patch),
        "patch_embed.proj.bias": r(width),
        "norm.weight": 1 + r(width),
        "norm.bias": r(width),
        "head.weight": r(10, width),
        "head.bias": r(10),
    }
    for i in range(depth):
        p = f"blocks.{i}."
        sd |= {p + "norm1.weight": 1 + r(width), p + "norm1.bias": r(width)}
        sd |= {p + "attn.qkv.weight": r(3 * width, width), p + "attn.qkv.bias": r(3 * width)}
        sd |= {p + "attn.proj.weight": r(width, width), p + "attn.proj.bias": r(width)}
        sd |= {p + "norm2.weight": 1 + r(width), p + "norm2.bias": r(width)}
        sd |= {p + "mlp.fc1.weight": r(4 * width, width), p + "mlp.fc1.bias": r(4 * width)}
        sd |= {p + "mlp.fc2.weight": r(width, 4 * width), p + "mlp.fc2.bias": r(width)}
    return sd


def timm_forward(sd: dict, x: torch.Tensor, heads: int, patch: int) -> torch.Tensor:
    """timm's ViT forward written out (fused qkv, class token removed): x (B, 3, H, W) -> (B, N, C)."""
    h = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=patch)
    h = h.flatten(2).transpose(1, 2) + sd["pos_embed"][:, 1:]
    b, n, c = h.shape
    for i in range(sum(k.endswith("attn.qkv.weight") for k in sd)):
        p = f"blocks.{i}."
        y = F.layer_norm(h, (c,), sd[p + "norm1.weight"], sd[p + "norm1.bias"], eps=1e-6)
        qkv = F.linear(y, sd[p + "attn.qkv.weight"], sd[p + "attn.qkv.bias"])
        q, k, v = qkv.reshape(b, n, 3, heads, c // heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = ((q @ k.transpose(-2, -1)) * (c // heads) ** -0.5).softmax(-1) @ v
        h = h + F.linear(a.transpose(1, 2).reshape(b, n, c), sd[p + "attn.proj.weight"], sd[p + "attn.proj.bias"])
        y = F.layer_norm(h, (c,), sd[p + "norm2.weight"], sd[p + "norm2.bias"], eps=1e-6)
        y = F.linear(F.gelu(F.linear(y, sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"])), sd[p + "mlp.fc2.weight"])
        h = h + y + sd[p + "mlp.fc2.bias"]
    return F.layer_norm(h, (c,), sd["norm.weight"], sd["norm.bias"], eps=1e-6)


def test_timm_weights_load_exactly(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    sd = timm_state_dict()
    torch.save(sd, tmp_path / "vit.pth")
    save_file(sd, str(tmp_path / "vit.safetensors"))
    x = torch.rand(2, 3, *HW)
    for name in ("vit.pth", "vit.safetensors"):
        loaded = ViTEncoder(ViTConfig(**TINY_VIT, pretrained=str(tmp_path / name)), out_dim=D, image_size=HW)
        torch.testing.assert_close(loaded.backbone(x), timm_forward(sd, x, heads=2, patch=8), rtol=1e-5, atol=1e-5)
    by_hand = ViTEncoder(ViTConfig(**TINY_VIT), out_dim=D, image_size=HW)
    with torch.no_grad():
        bb = by_hand.backbone
        bb.patch_embed.proj.weight.copy_(sd["patch_embed.proj.weight"])
        bb.patch_embed.proj.bias.copy_(sd["patch_embed.proj.bias"])
        bb.pos_embed.copy_(sd["pos_embed"][:, 1:])
        bb.norm.weight.copy_(sd["norm.weight"])
        bb.norm.bias.copy_(sd["norm.bias"])
        for i, blk in enumerate(bb.blocks):
            p = f"blocks.{i}."
            for part in ("weight", "bias"):
                qkv = sd[p + "attn.qkv." + part]
                getattr(blk.attn.q, part).copy_(qkv[:32])
                getattr(blk.attn.kv, part).copy_(qkv[32:])
                for mod in ("norm1", "norm2", "attn.proj", "mlp.fc1", "mlp.fc2"):
                    blk.get_submodule(mod).get_parameter(part).copy_(sd[p + mod + "." + part])
    assert torch.equal(by_hand.backbone(x), loaded.backbone(x))


def test_pretrained_errors_are_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pth"
    with pytest.raises(FileNotFoundError, match="nope.pth") as err:
        ViTEncoder(ViTConfig(**TINY_VIT, pretrained=str(missing)), out_dim=D, image_size=HW)
    assert "\n" not in str(err.value)
    bad = timm_state_dict()
    bad["blocks.1.mlp.fc1.weight"] = torch.zeros(64, 32)
    torch.save(bad, tmp_path / "bad.pth")
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp\.fc1\.weight has shape \(64, 32\)") as err:
        ViTEncoder(ViTConfig(**TINY_VIT, pretrained=str(tmp_path / "bad.pth")), out_dim=D, image_size=HW)
    assert "\n" not in str(err.value)
    torch.save(timm_state_dict(depth=3), tmp_path / "deep.pth")
    with pytest.raises(ValueError, match=r"unexpected key 'blocks\.2\."):
        ViTEncoder(ViTConfig(**TINY_VIT, pretrained=str(tmp_path / "deep.pth")), out_dim=D, image_size=HW)


def test_pos_embed_is_interpolated_for_another_grid(tmp_path: Path) -> None:
    sd = timm_state_dict(grid=4)
    sd["pos_embed"][:, 1:] = 0.3  # a constant grid stays constant under bilinear resizing
    torch.save(sd, tmp_path / "vit.pth")
    enc = ViTEncoder(ViTConfig(**TINY_VIT, pretrained=str(tmp_path / "vit.pth")), out_dim=D, image_size=(48, 64))
    assert enc.backbone.pos_embed.shape == (1, 6 * 8, 32)
    torch.testing.assert_close(enc.backbone.pos_embed, torch.full((1, 48, 32), 0.3))
    assert enc(torch.randint(0, 256, (2, 3, 48, 64), dtype=torch.uint8)).shape == (2, 48, D)


def test_proprio_skip_adds_a_linear_map_of_the_frames() -> None:
    enc = make_encoder(("rgb", "joints")).eval()
    obs = make_obs()
    with torch.no_grad():
        out = enc(obs)
        skip = enc.skip["joints"](obs["joints"].flatten(1))  # (B, D) from the To frames
        enc.skip = None
        plain = enc(obs)
    torch.testing.assert_close(out.pooled, plain.pooled + skip)
    torch.testing.assert_close(out.tokens, plain.tokens + skip[:, None])
    assert make_encoder(("rgb", "joints"), proprio_skip=False).skip is None


def test_resnet_stage_strides_set_the_keypoint_map() -> None:
    cfg = {"widths": (8, 8, 8, 8), "group_size": 4, "n_keypoints": 3}
    standard = ResNet18GN(ResNetGNConfig(**cfg), out_dim=D, image_size=(64, 64))
    fine = ResNet18GN(
        ResNetGNConfig(**cfg, stem_pool=False, stage_strides=(1, 2, 2, 1)), out_dim=D, image_size=(64, 64)
    )
    assert standard.keypoints.grid.shape == (2 * 2, 2) and fine.keypoints.grid.shape == (8 * 8, 2)
    images = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8)
    assert fine(images).shape == (2, 3, D)
    with pytest.raises(ValueError, match="stage_strides"):
        ResNetGNConfig(stage_strides=(1, 2, 3, 2))


def test_instruction_queries_make_the_latents_read_depend_on_the_instruction() -> None:
    enc = make_encoder(("rgb", "instruction")).eval()
    obs = make_obs()
    with torch.no_grad():
        out = enc(obs)
        masked = enc(obs, present={"instruction": torch.zeros(B, dtype=torch.bool)})
        torch.nn.init.zeros_(enc.text_query.weight)
        torch.nn.init.zeros_(enc.text_query.bias)
        no_query = enc(obs)
    # Zero query weights give the fixed-query Perceiver; the learnt map changes what the latents read.
    assert not torch.allclose(out.tokens, no_query.tokens)
    plain = make_encoder(("rgb", "instruction"), instruction_queries=False).eval()
    assert not hasattr(plain, "text_query")
    assert not hasattr(make_encoder(("rgb", "instruction"), fusion="concat"), "text_query")
    assert torch.isfinite(masked.tokens).all()


def test_instruction_attention_pool_starts_as_the_mean_and_reads_only_valid_tokens() -> None:
    obs = make_obs()
    mean = make_encoder(("rgb", "instruction")).eval()
    attn = make_encoder(("rgb", "instruction"), experimental=MultimodalExperimental("attention")).eval()
    assert not hasattr(mean, "text_pool")
    attn.load_state_dict(mean.state_dict() | {"text_pool": attn.text_pool.detach()})
    with torch.no_grad():
        torch.testing.assert_close(attn(obs).tokens, mean(obs).tokens, rtol=0, atol=1e-6)  # zero query: the mean
        torch.nn.init.normal_(attn.text_pool, std=3.0)
        learned = attn(obs)
        tokens, mask = attn._encode("instruction", obs["instruction"])
        garbage = torch.where(mask[..., None], tokens, torch.full_like(tokens, 1e4))  # padding changed wildly
        q = attn._from_instruction(attn.text_query, tokens, mask)
        assert torch.equal(q, attn._from_instruction(attn.text_query, garbage, mask))
        none = attn._from_instruction(attn.text_query, tokens, torch.zeros_like(mask))
    assert not torch.allclose(learned.tokens, mean(obs).tokens)
    assert torch.equal(none, torch.zeros_like(none))
    # A sample with no valid token gives finite gradients to the pooling query.
    attn.train()
    out = attn(obs, present={"instruction": torch.tensor([True, False, True])})
    out.pooled.square().sum().backward()
    assert attn.text_pool.grad is not None and torch.isfinite(attn.text_pool.grad).all()
    assert attn.text_pool.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="experimental.instruction_pool"):
        MultimodalExperimental(instruction_pool="max")


def test_instruction_film_moves_only_the_rgb_features_and_respects_masks() -> None:
    fine = ResNetGNConfig(widths=(8, 8, 16, 16), n_keypoints=5, stem_pool=False, stage_strides=(1, 2, 2, 1))
    enc = make_encoder(("rgb", "instruction"), rgb_encoder="resnet", resnet=fine, instruction_film=True).eval()
    obs = make_obs()
    with torch.no_grad():
        identity = enc(obs)  # zero-initialised FiLM: the plain encoder
        torch.nn.init.normal_(enc.film.weight, std=0.5)
        torch.nn.init.normal_(enc.film.bias, std=0.5)
        filmed = enc(obs)
        masked = enc(obs, present={"instruction": torch.zeros(B, dtype=torch.bool)})
        without = enc({k: v for k, v in obs.items() if k != "instruction"})
        rgb_only = enc({"rgb": obs["rgb"]})
    assert not torch.allclose(identity.tokens, filmed.tokens)
    # A masked instruction is a missing one: no FiLM, no tokens, no query.
    torch.testing.assert_close(masked.tokens, without.tokens, rtol=0, atol=1e-5)
    torch.testing.assert_close(without.tokens, rgb_only.tokens, rtol=0, atol=0)
    with pytest.raises(ValueError, match="instruction_film"):
        make_encoder(("rgb", "instruction"), instruction_film=True)  # the ViT has no FiLM


def test_resnet_channels_last_computes_the_same_features() -> None:
    cfg = {"widths": (8, 8, 16, 16), "group_size": 4, "n_keypoints": 5}
    nhwc = ResNet18GN(ResNetGNConfig(**cfg), out_dim=D, image_size=HW)
    nchw = ResNet18GN(ResNetGNConfig(**cfg, channels_last=False), out_dim=D, image_size=HW)
    nchw.load_state_dict(nhwc.state_dict())
    images = torch.randint(0, 256, (4, 3, *HW), dtype=torch.uint8)
    out = nhwc(images)
    torch.testing.assert_close(out, nchw(images), rtol=1e-4, atol=1e-5)
    out.sum().backward()  # and it trains in that layout
    assert all(p.grad is not None for p in nhwc.parameters() if p.requires_grad)


@pytest.mark.parametrize("rgb_encoder", ["vit", "resnet"])
def test_image_obs_steps_encodes_only_the_latest_frames(rgb_encoder: str) -> None:
    # TINY_RESNET's map is 1 x 1 at 32 px (its keypoint reads 0 for every image): the preset's stride-1 layout here
    kw = {"rgb_encoder": rgb_encoder, "resnet": ResNetGNConfig(**{**vars(TINY_RESNET), "stage_strides": (1, 1, 1, 1)})}
    enc = make_encoder(("rgb", "depth", "joints"), image_obs_steps=1, **kw).eval()
    full = make_encoder(("rgb", "depth", "joints"), **kw)
    assert enc.n_tokens["rgb"] == full.n_tokens["rgb"] // TO and enc.n_tokens["joints"] == TO
    obs = make_obs()
    changed_old = {**obs, "rgb": obs["rgb"].clone(), "depth": obs["depth"].clone()}
    changed_old["rgb"][:, 0] = 255 - changed_old["rgb"][:, 0]
    changed_old["depth"][:, 0] = 0.3
    changed_new = {**obs, "rgb": obs["rgb"].clone()}
    changed_new["rgb"][:, -1] = 255 - changed_new["rgb"][:, -1]
    joints_old = {**obs, "joints": obs["joints"].clone()}
    joints_old["joints"][:, 0] += 1.0
    with torch.no_grad():
        ref = enc(obs).pooled
        torch.testing.assert_close(enc(changed_old).pooled, ref)  # the older image frame is never read
        assert not torch.allclose(enc(changed_new).pooled, ref)
        assert not torch.allclose(enc(joints_old).pooled, ref)  # joints keep every frame
    with pytest.raises(ValueError, match=r"expected \(B, 2, C, H, W\)"):
        enc({"rgb": obs["rgb"][:, -1:]})  # the caller still gives To frames


def test_image_obs_steps_errors_name_the_key() -> None:
    from dmrl.policies.base import ChunkConfig

    with pytest.raises(ValueError, match="image_obs_steps"):
        MultimodalEncoderConfig(image_obs_steps=0)
    with pytest.raises(ValueError, match="image_obs_steps: got 3; allowed at most To = 2"):
        make_encoder(("rgb",), image_obs_steps=3)
    with pytest.raises(ValueError, match=r"chunk.encoder.image_obs_steps: got 3; .* chunk.n_obs_steps = 2"):
        ChunkConfig(obs_keys=("rgb",), encoder=MultimodalEncoderConfig(image_obs_steps=3))


def test_instruction_views_are_what_the_forward_pass_uses() -> None:
    class TextWithStates(FakeText):
        def hidden_states(self, instructions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
            return self(instructions)

    fine = ResNetGNConfig(widths=(8, 8, 16, 16), n_keypoints=5, stem_pool=False, stage_strides=(1, 2, 2, 1))
    enc = make_encoder(("rgb", "instruction"), rgb_encoder="resnet", resnet=fine, instruction_film=True).eval()
    enc.text_encoder = TextWithStates()
    torch.nn.init.normal_(enc.film.weight, std=0.5)
    obs = make_obs()
    seen = {}
    rgb = enc.frames["rgb"]
    original = rgb.forward

    def spy(images, film=None):
        seen["film"] = film
        return original(images, film)

    rgb.forward = spy
    with torch.no_grad():
        enc(obs)
    rgb.forward = original
    views = enc.instruction_views(obs["instruction"])
    torch.testing.assert_close(views["film"], seen["film"])  # the FiLM the image features got
    assert views["tokens"].shape == (B, D) and views["text"].shape == (B, FakeText.out_dim)
    # A sentence's views do not depend on the batch it is in.
    alone = enc.instruction_views(obs["instruction"][1:2])
    for key, value in alone.items():
        torch.testing.assert_close(value[0], views[key][1])
    with pytest.raises(ValueError, match="no instruction modality"):
        make_encoder(("rgb", "joints")).instruction_views(["open the drawer"])
