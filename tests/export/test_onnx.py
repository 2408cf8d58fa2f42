"""ONNX export of the diffusion chunk planner: onnxruntime reproduces torch, act() runs on it, errors are one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dmrl.cli import main
from dmrl.export import ChunkGraph, OnnxPlanner, export_onnx, input_spec
from dmrl.export.onnx import example_inputs
from dmrl.policies import build_policy
from dmrl.policies.base import ChunkConfig
from dmrl.policies.checkpoint import save_policy
from dmrl.policies.diffusion import DiffusionPolicyConfig
from dmrl.policies.gaussian import GaussianPolicyConfig

pytest.importorskip("onnxruntime")

STATE_DIM, ACTION_DIM = 31, 6  # MultiPathGrasp-v0 with 3 cups: state (31,), action (6,)


def _policy(policy: str = "diffusion", **diffusion) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = {
        "diffusion": DiffusionPolicyConfig(denoiser_kwargs={"hidden_dim": 64, "n_blocks": 1}, **diffusion),
        "gaussian": GaussianPolicyConfig(),
    }
    chunk = ChunkConfig(obs_keys=("state",), horizon=8, n_action_steps=4)
    p = build_policy(policy, chunk, cfg.get(policy), {"state": STATE_DIM}, ACTION_DIM)
    for q in p.parameters():  # the zero-initialised head would make every chunk the same constant
        torch.nn.init.normal_(q, std=0.1)
    return p.eval()


@pytest.mark.parametrize(
    "settings",
    [
        {"prediction_type": "sample", "num_inference_steps": 4},
        {"prediction_type": "hybrid", "num_inference_steps": 3, "ddim_eta": 1.0},  # stochastic: step_noise input
    ],
    ids=["x0-ddim", "hybrid-stochastic"],
)
def test_onnxruntime_matches_torch_on_fresh_inputs(tmp_path, settings):
    policy = _policy(**settings)
    path = tmp_path / "p.onnx"
    report = export_onnx(policy, path, batch_size=2)
    assert report.max_abs_diff < 1e-5 and path.is_file()
    spec = json.loads((tmp_path / "p.onnx.json").read_text())["inputs"]
    assert ("step_noise" in spec) == (settings.get("ddim_eta", 0.0) > 0)
    planner = OnnxPlanner(path)
    graph = ChunkGraph(policy)
    for seed in (1, 2):  # not the inputs the export checked itself on
        feeds = example_inputs(input_spec(policy, 2), seed=seed)
        with torch.no_grad():
            expected = graph(*(torch.from_numpy(v) for v in feeds.values())).numpy()
        got = planner.run(feeds)
        assert got.shape == (2, 8, ACTION_DIM)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        assert np.abs(expected).max() > 1e-3  # the chunk is not a constant that would match trivially
    # The graph is predict_chunk: same noise, same chunk (torch's own sampler, global RNG fixed).
    feeds = example_inputs(input_spec(policy, 2), seed=3)
    torch.manual_seed(5)
    init = torch.randn(2, 8, ACTION_DIM)
    steps = torch.randn(policy.sampler.num_steps, 2, 8, ACTION_DIM)
    torch.manual_seed(5)
    ref = policy.predict_chunk({"state": torch.from_numpy(feeds["state"])}).numpy()
    feeds["init_noise"] = init.numpy()
    if "step_noise" in feeds:
        feeds["step_noise"] = steps.numpy()
    np.testing.assert_allclose(planner.run(feeds), ref, atol=1e-5)


def test_act_with_onnx_planner_serves_any_batch(tmp_path):
    policy = _policy(prediction_type="sample", num_inference_steps=2)
    export_onnx(policy, tmp_path / "p.onnx", batch_size=1)
    calls = []
    planner = OnnxPlanner(tmp_path / "p.onnx")

    def counted(obs):
        calls.append(obs["state"].shape[0])
        return planner(obs)

    policy.set_planner(counted)
    obs = {"state": np.random.default_rng(0).standard_normal((3, STATE_DIM)).astype(np.float32)}
    actions = [policy.act(obs) for _ in range(5)]  # Ta = 4: plans at steps 0 and 4
    assert calls == [3, 3] and all(a.shape == (3, ACTION_DIM) for a in actions)
    assert all(np.abs(a).max() <= 1.0 for a in actions)
    # planning rows of a batch-1 graph one by one gives each row's own chunk
    rows = torch.from_numpy(obs["state"])[:, None].expand(3, 2, STATE_DIM).contiguous()
    planner.rng = np.random.default_rng(7)
    batch = planner({"state": rows})
    planner.rng = np.random.default_rng(7)
    single = [planner({"state": rows[i : i + 1]}) for i in range(3)]
    torch.testing.assert_close(batch, torch.cat(single))
    policy.set_planner(None)
    assert policy.act(obs).shape == (3, ACTION_DIM)


def test_export_errors_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="covers diffusion policies"):
        export_onnx(_policy("gaussian"), tmp_path / "g.onnx")
    with pytest.raises(ValueError, match=r"must end in \.onnx"):
        export_onnx(_policy(), tmp_path / "p.bin")
    with pytest.raises(FileNotFoundError, match="dmrl export"):
        OnnxPlanner(tmp_path / "missing.onnx")
    (tmp_path / "lonely.onnx").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="lonely.onnx.json"):
        OnnxPlanner(tmp_path / "lonely.onnx")


def test_cli_export_then_eval_on_onnxruntime(tmp_path, capsys):
    ckpt = save_policy(
        tmp_path / "run" / "checkpoint",
        _policy(prediction_type="sample", num_inference_steps=2),
        {"env_id": "dmrl/MultiPathGrasp-v0"},
    )
    assert main(["export", "--checkpoint", str(ckpt), "--inference-steps", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_abs_diff_vs_torch"] < 1e-5 and (ckpt / "policy.onnx").is_file()
    assert json.loads((ckpt / "policy.onnx.json").read_text())["num_inference_steps"] == 3
    args = ["eval", "--checkpoint", str(ckpt), "--onnx", str(ckpt / "policy.onnx"), "--episodes", "2"]
    assert main([*args, "--envs", "1", "--gif-episodes", "0"]) == 0
    result = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    assert result["episodes"] == 2 and result["planner"].startswith("onnxruntime:")
    # bad input: one line, nothing written
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing config.json" in err
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "x.txt")]) == 2
    assert not (tmp_path / "x.txt").exists()
