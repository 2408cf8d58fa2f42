"""ONNX export of every policy kind: onnxruntime reproduces torch, the graph is predict_chunk for the same noise,
act() runs on it, the sidecar records the opset and operators, errors are one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from export_helpers import STATE_DIM, TEXTS, Exported, state_policy

from dmrl.cli import main
from dmrl.export import ChunkGraph, OnnxPlanner, export_onnx, input_spec
from dmrl.export.onnx import OPSET, example_inputs, graph_ops
from dmrl.policies import POLICIES
from dmrl.policies.gaussian import GaussianPolicyConfig

KINDS = ["multimodal-diffusion", "gaussian", "vae", "student"]


def _get(exported: dict[str, Exported], kind: str) -> Exported:
    if kind not in exported:
        pytest.skip(f"policy kind {kind!r} is not registered in this checkout")
    return exported[kind]


def _torch_feeds(ex: Exported, feeds: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(v) for v in feeds.values())


@pytest.mark.parametrize("kind", KINDS)
def test_onnxruntime_matches_torch_on_fresh_inputs(exported, kind):
    ex = _get(exported, kind)
    planner = OnnxPlanner(ex.path, text_encoder=getattr(ex.policy.encoder, "text_encoder", None))
    graph = ChunkGraph(ex.policy)
    spec = input_spec(ex.policy, ex.batch)
    assert ex.sidecar["max_abs_diff"] <= 1e-4  # the export's own check, which it passed before keeping the file
    for seed in (1, 2):  # not the inputs the export checked itself on
        feeds = example_inputs(spec, seed=seed)
        with torch.no_grad():
            expected = graph(*_torch_feeds(ex, feeds)).numpy()
        got = planner.run(feeds)
        assert got.shape == (ex.batch, ex.policy.chunk.horizon, ex.policy.action_dim)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        assert np.abs(expected).max() > 1e-3  # the chunk is not a constant that would match trivially
        assert 0.0 < np.abs(expected).max() <= 1.0  # raw actions, clipped


def _draw_like_torch(ex: Exported, b: int) -> dict[str, torch.Tensor]:
    """The kind's noise inputs, drawn from torch's global RNG in the order its sample_chunk draws them."""
    p = ex.policy
    chunk = (b, p.chunk.horizon, p.action_dim)
    if p.name == "gaussian":
        return {}  # it executes its mean chunk
    if p.name == "vae":
        return {"z": torch.randn(b, p.config.latent_dim)}
    noise = {"init_noise": torch.randn(chunk)}
    steps = p.sampler.num_steps if p.name == "diffusion" else len(p.starts) - 1
    if p.name == "student" or p.sampler.stochastic:
        noise["step_noise"] = torch.stack([torch.randn(chunk) for _ in range(steps)])
    return noise


@pytest.mark.parametrize("kind", KINDS)
def test_graph_is_predict_chunk_for_the_same_noise(exported, kind):
    ex = _get(exported, kind)
    p = ex.policy
    feeds = example_inputs(input_spec(p, ex.batch), seed=3)
    obs = {k: torch.from_numpy(v) for k, v in feeds.items() if k in p.chunk.obs_keys}
    text = getattr(p.encoder, "text_encoder", None)
    if text is not None:  # the graph reads what the LanguageEncoder makes of the strings
        obs["instruction"] = list(TEXTS[: ex.batch])
        with torch.no_grad():
            tokens, mask = text(obs["instruction"])
        feeds["instruction_tokens"], feeds["instruction_mask"] = tokens.numpy(), mask.numpy()
    torch.manual_seed(5)
    noise = _draw_like_torch(ex, ex.batch)
    torch.manual_seed(5)
    ref = p.predict_chunk(obs).numpy()  # torch's own sampler on the global RNG
    assert set(noise) == set(ex.sidecar["noise_inputs"])
    feeds |= {k: v.numpy() for k, v in noise.items()}
    got = OnnxPlanner(ex.path, text_encoder=text).run(feeds)
    np.testing.assert_allclose(got, ref, atol=1e-5)


@pytest.mark.parametrize("kind", ["multimodal-diffusion", "gaussian", "vae", "student"])
def test_sidecar_records_opset_operators_and_inputs(exported, kind):
    ex = _get(exported, kind)
    side = ex.sidecar
    assert side["opset"] == OPSET and side["policy"] == ex.policy.name
    assert side["ops"] == graph_ops(ex.path) and sum(side["ops"].values()) > 10
    assert list(side["inputs"]) == list(input_spec(ex.policy, ex.batch))
    if kind == "multimodal-diffusion":
        assert side["inputs"]["rgb"]["dtype"] == "uint8" and side["inputs"]["instruction_mask"]["dtype"] == "bool"
        assert side["inputs"]["instruction_tokens"]["shape"] == [2, 12, 32]  # (B, L, D_text)
        assert "MatMul" in side["ops"] and "Conv" in side["ops"]  # attention and the ViT's patch embedding


def test_act_with_onnx_planner_serves_any_batch(exported):
    ex = _get(exported, "student")
    policy = ex.policy
    calls = []
    planner = OnnxPlanner(ex.path)

    def counted(obs):
        calls.append(obs["state"].shape[0])
        return planner(obs)

    policy.set_planner(counted)
    try:
        obs = {"state": np.random.default_rng(0).standard_normal((3, STATE_DIM)).astype(np.float32)}
        actions = [policy.act(obs) for _ in range(5)]  # Ta = 4: plans at steps 0 and 4
        assert calls == [3, 3] and all(a.shape == (3, policy.action_dim) for a in actions)
        assert all(np.abs(a).max() <= 1.0 for a in actions)
    finally:
        policy.set_planner(None)
        policy.reset()
    # planning rows of a batch-1 graph one by one gives each row's own chunk
    rows = torch.from_numpy(obs["state"])[:, None].expand(3, 2, STATE_DIM).contiguous()
    planner.rng = np.random.default_rng(7)
    batch = planner({"state": rows})
    planner.rng = np.random.default_rng(7)
    single = [planner({"state": rows[i : i + 1]}) for i in range(3)]
    torch.testing.assert_close(batch, torch.cat(single))


def test_batch_one_decision_is_the_graph_on_the_seeded_noise(exported):
    # The planner's batch-1 path (a robot's decision): obs converted without a needless copy, the noise drawn as
    # float64 standard normals from its seed and cast down (the stream earlier versions drew), each call's chunk
    # its own array.
    ex = _get(exported, "student")
    planner = OnnxPlanner(ex.path, seed=11)
    state = np.random.default_rng(1).standard_normal((1, 2, STATE_DIM))  # float64: the planner casts it
    obs = {"state": torch.from_numpy(state)}
    first, second = planner(obs), planner(obs)
    rng = np.random.default_rng(11)
    for got in (first, second):
        feeds = {"state": state.astype(np.float32)}
        for name in ex.sidecar["noise_inputs"]:
            feeds[name] = rng.standard_normal(ex.sidecar["inputs"][name]["shape"]).astype(np.float32)
        np.testing.assert_array_equal(got.numpy(), planner.run(feeds))
    assert first.dtype == torch.float32 and not torch.equal(first, second)  # fresh noise per decision
    # a non-contiguous float32 view gives the same chunk as its contiguous copy
    wide = torch.from_numpy(np.repeat(state.astype(np.float32), 2, axis=2))[..., ::2]
    assert not wide.is_contiguous()
    planner.rng = np.random.default_rng(3)
    a = planner({"state": wide})
    planner.rng = np.random.default_rng(3)
    torch.testing.assert_close(a, planner({"state": wide.contiguous()}), rtol=0, atol=0)


def test_every_registered_policy_kind_is_exported(exported):
    names = {ex.policy.name for ex in exported.values()}
    assert set(POLICIES) <= names, f"add an export of {sorted(set(POLICIES) - names)} to tests/export/conftest.py"


def test_export_errors_are_one_line(exported, tmp_path):
    policy = state_policy("gaussian", GaussianPolicyConfig(hidden=32, depth=1))
    policy.name = "mystery"  # a kind without a graph builder
    with pytest.raises(ValueError, match="no ONNX graph builder for a 'mystery' policy"):
        export_onnx(policy, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()
    with pytest.raises(ValueError, match=r"must end in \.onnx"):
        export_onnx(exported["vae"].policy, tmp_path / "p.bin")
    with pytest.raises(FileNotFoundError, match="dmrl export"):
        OnnxPlanner(tmp_path / "missing.onnx")
    (tmp_path / "lonely.onnx").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="lonely.onnx.json"):
        OnnxPlanner(tmp_path / "lonely.onnx")
    with pytest.raises(ValueError, match="pass text_encoder="):
        OnnxPlanner(exported["multimodal-diffusion"].path)


def test_cli_export_then_eval_on_onnxruntime(exported, capsys):
    ckpt = exported["gaussian"].path.parent  # the fixture ran `dmrl export --checkpoint CKPT`
    side = exported["gaussian"].sidecar
    assert side["policy"] == "gaussian" and side["max_abs_diff"] < 1e-5 and side["noise_inputs"] == []
    assert side["meta"]["checkpoint"] == str(ckpt)
    args = ["eval", "--checkpoint", str(ckpt), "--onnx", str(ckpt / "policy.onnx"), "--episodes", "2"]
    assert main([*args, "--envs", "1", "--gif-episodes", "0"]) == 0
    result = json.loads((ckpt.parent / "eval" / "eval.json").read_text())
    assert result["episodes"] == 2 and result["planner"].startswith("onnxruntime:") and result["policy"] == "gaussian"
    # bad input: one line, nothing written
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(ckpt.parent / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing config.json" in err
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(ckpt / "x.txt")]) == 2
    assert not (ckpt / "x.txt").exists()
    assert main([*args, "--drop-modality", "state", "--out", str(ckpt.parent / "drop")]) == 2
    assert "--drop-modality with --onnx" in capsys.readouterr().err and not (ckpt.parent / "drop").exists()


def test_planner_embeds_each_instruction_once_and_acts_on_env_steps(exported):
    ex = exported["multimodal-diffusion"]
    policy, text = ex.policy, ex.policy.encoder.text_encoder
    seen: list[list[str]] = []

    class Counting(torch.nn.Module):
        out_dim = text.out_dim

        def forward(self, instructions):
            seen.append(list(instructions))
            return text(instructions)

    planner = OnnxPlanner(ex.path, text_encoder=Counting(), seed=3)
    rng = np.random.default_rng(0)

    def step(texts):
        n = len(texts)
        return {
            "rgb": rng.integers(0, 256, (n, 3, 16, 16), dtype=np.uint8),
            "depth": rng.uniform(0.2, 2.0, (n, 1, 16, 16)).astype(np.float32),
            "joints": rng.standard_normal((n, 6)).astype(np.float32),
            "force": rng.standard_normal((n, 4)).astype(np.float32),
            "instruction": tuple(texts),
        }

    policy.set_planner(planner)
    try:
        for t in range(9):  # Ta = 4: three plans; three envs, two instructions, then a new one for env 0
            texts = [TEXTS[0], TEXTS[1], TEXTS[0]] if t < 4 else [TEXTS[2], TEXTS[1], TEXTS[0]]
            a = policy.act(step(texts))
            assert a.shape == (3, policy.action_dim) and np.isfinite(a).all() and np.abs(a).max() <= 1.0
    finally:
        policy.set_planner(None)
        policy.reset()
    # MiniLM ran once per distinct instruction, on the first plan that saw it
    assert seen == [[TEXTS[0], TEXTS[1]], [TEXTS[2]]]
    # the planner's chunk is the graph's for the cached embedding and the planner's own noise
    obs = {k: torch.from_numpy(np.stack([v, v], axis=1)) for k, v in step(TEXTS[:2]).items() if k != "instruction"}
    obs["instruction"] = list(TEXTS[:2])
    planner.rng = np.random.default_rng(11)
    got = planner(obs).numpy()
    rng2 = np.random.default_rng(11)
    spec = planner.spec
    noise = {k: rng2.standard_normal(spec[k][0]).astype(np.float32) for k in planner.noise}
    with torch.no_grad():
        tokens, mask = text(obs["instruction"])
        feeds = {k: obs[k] for k in ("rgb", "depth", "joints", "force")}
        feeds |= {"instruction_tokens": tokens, "instruction_mask": mask}
        feeds |= {k: torch.from_numpy(v) for k, v in noise.items()}
        expected = ChunkGraph(policy)(*(feeds[k] for k in spec)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
