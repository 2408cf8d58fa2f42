"""The policy server gives each client exactly what ``policy.act`` gives it alone: per-client queue, history and
noise, across interleaved episodes, disconnects and modalities."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
from serve_helpers import direct_actions, state_obs, wait_sessions

from dmrl.policies.checkpoint import load_policy
from dmrl.serve.client import PolicyClient, ServerError

ARTIFACTS = __import__("pathlib").Path(__file__).resolve().parents[1] / "artifacts"


def test_two_clients_interleaving_episodes_get_the_direct_act_sequence(server, state_checkpoint):
    # Episodes of different lengths (Ta 4: plans at steps 0, 4, 8), resets at different times, steps interleaved.
    plan = {
        "a": [(11, state_obs(1, 7)), (12, state_obs(2, 10))],
        "b": [(21, state_obs(3, 9)), (11, state_obs(1, 6))],  # b's second episode: a's first seed and observations
    }
    clients = {name: PolicyClient(server.url) for name in plan}
    got: dict[str, list[list[np.ndarray]]] = {name: [] for name in plan}
    cursor = {name: [0, 0] for name in plan}  # (episode, step)
    while any(cursor[n][0] < len(plan[n]) for n in plan):
        for name, client in clients.items():
            ep, t = cursor[name]
            if ep >= len(plan[name]):
                continue
            seed, steps = plan[name][ep]
            if t == 0:
                assert client.reset(seed=seed) == seed
                got[name].append([])
            got[name][ep].append(client.act(steps[t]))
            cursor[name] = [ep + 1, 0] if t + 1 == len(steps) else [ep, t + 1]
    assert len(server.sessions) == 2
    for c in clients.values():
        c.close()
    policy = load_policy(state_checkpoint)[0]
    for name in plan:
        want = direct_actions(policy, plan[name])
        for ep, w in enumerate(want):
            np.testing.assert_array_equal(np.stack(got[name][ep]), w)
    # The same seed and observations give the same actions (b's second episode = a's first), other seeds do not.
    np.testing.assert_array_equal(np.stack(got["b"][1]), np.stack(got["a"][0])[:6])
    assert not np.allclose(np.stack(got["a"][1])[:6], np.stack(got["b"][0])[:6])


def test_reset_without_seed_draws_one_and_reports_it(server):
    with PolicyClient(server.url) as c:
        seeds = {c.reset() for _ in range(3)}
        assert len(seeds) == 3  # fresh noise per episode unless the client fixes it
        assert c.info["obs_spec"] == {"state": {"dtype": "float32", "shape": [7]}} and c.info["action_dim"] == 3
        reply = c.request({"cmd": "act", "obs": state_obs(0, 1)[0]})
        assert reply["planned"] and reply["step"] == 1


@pytest.mark.parametrize("how", ["tcp-reset", "mid-request"])
def test_client_that_disconnects_mid_episode_leaves_the_others_served(server, state_checkpoint, how):
    steps = state_obs(5, 9)
    keep = PolicyClient(server.url)
    keep.reset(seed=3)
    got = [keep.act(o) for o in steps[:3]]
    gone = PolicyClient(server.url)
    gone.reset(seed=4)
    gone.act(steps[0])
    wait_sessions(server, 2)
    if how == "mid-request":  # a request on its way, then the socket dies before the reply can be sent
        from dmrl.serve.protocol import pack

        gone.conn.send(pack({"cmd": "act", "obs": steps[1]}))
    # No close handshake: the TCP connection is torn down as a crashed robot process would leave it.
    gone.conn.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    gone.conn.socket.close()
    wait_sessions(server, 1)
    got += [keep.act(o) for o in steps[3:]]
    keep.close()
    want = direct_actions(load_policy(state_checkpoint)[0], [(3, steps)])[0]
    np.testing.assert_array_equal(np.stack(got), want)


def test_a_client_over_the_limit_is_closed_with_try_again_later(server):
    from websockets.exceptions import ConnectionClosed

    clients = [PolicyClient(server.url) for _ in range(server.max_clients)]
    with pytest.raises(ConnectionClosed) as e:
        PolicyClient(server.url)
    assert e.value.rcvd is not None and e.value.rcvd.code == 1013
    for c in clients:
        c.close()
    wait_sessions(server, 0)
    with PolicyClient(server.url) as c:  # room again
        assert c.reset(seed=1) == 1


def _mm_obs(rng: np.random.Generator, text: str | None = None) -> dict:
    obs = {
        "rgb": rng.integers(0, 256, (3, 16, 16), dtype=np.uint8),
        "depth": rng.uniform(0.2, 2.0, (1, 16, 16)).astype(np.float32),
        "joints": rng.normal(size=6).astype(np.float32),
        "force": rng.normal(size=4).astype(np.float32),
    }
    return obs if text is None else {**obs, "instruction": text}


def test_multimodal_checkpoint_images_and_a_withheld_modality():
    from dmrl.serve.server import PolicyServer
    from dmrl.serve.session import PolicyHost

    policy = load_policy(ARTIFACTS / "golden_multimodal")[0]
    rng = np.random.default_rng(0)
    steps = [_mm_obs(rng) for _ in range(6)]
    with PolicyServer(PolicyHost(policy), port=0) as server, PolicyClient(server.url) as c:
        assert c.info["obs_spec"]["rgb"] == {"dtype": "uint8", "shape": [3, 16, 16]}
        c.reset(seed=7)
        full = np.stack([c.act(o) for o in steps])
        with pytest.raises(ServerError, match=r"obs lacks 'depth'.*withhold it with reset drop"):
            c.act({k: v for k, v in steps[0].items() if k != "depth"})
        with pytest.raises(ServerError, match=r"obs\['rgb'\] is float32 \[3, 16, 16\]; the policy wants uint8"):
            c.act({**steps[0], "rgb": steps[0]["rgb"].astype(np.float32)})
        assert c.reset(seed=7, drop=("depth",)) == 7
        no_depth = [{k: v for k, v in o.items() if k != "depth"} for o in steps]
        dropped = np.stack([c.act(o) for o in no_depth])
        with pytest.raises(ServerError, match="reset declared withheld"):
            c.act(steps[0])
    np.testing.assert_array_equal(full, direct_actions(policy, [(7, steps)])[0])
    np.testing.assert_array_equal(dropped, direct_actions(policy, [(7, no_depth)])[0])
    assert not np.allclose(full, dropped)  # the mask changed the condition: depth was really withheld


def test_instruction_strings_reach_a_language_conditioned_policy():
    from dmrl.models import LanguageConfig, MultimodalEncoderConfig, PerceiverConfig, ViTConfig
    from dmrl.models.depth import DepthConfig
    from dmrl.policies import ChunkConfig, DiffusionPolicyConfig, build_policy
    from dmrl.serve.server import PolicyServer
    from dmrl.serve.session import PolicyHost

    torch.manual_seed(0)
    enc = MultimodalEncoderConfig(
        dim=32,
        vit=ViTConfig(width=32, depth=1, n_heads=2, patch_size=8),
        depth=DepthConfig(width=16, depth=1, n_heads=2, patch_size=8),
        perceiver=PerceiverConfig(n_latents=4, n_heads=2, n_layers=1),
        concat_hidden=32,
        language=LanguageConfig(out_dim=32, trainable_layers=0),
    )
    keys = ("rgb", "depth", "joints", "force", "instruction")
    chunk = ChunkConfig(obs_keys=keys, n_obs_steps=2, horizon=8, n_action_steps=4, encoder=enc)
    cfg = DiffusionPolicyConfig(
        denoiser="mlp", denoiser_kwargs={"hidden_dim": 32, "n_blocks": 1}, num_inference_steps=2
    )
    dims = {"rgb": (3, 16, 16), "depth": (1, 16, 16), "joints": 6, "force": 4}
    policy = build_policy("diffusion", chunk, cfg, dims, 3).eval()
    for name, q in policy.named_parameters():
        if "text" not in name and "language" not in name:  # MiniLM keeps its weights; the rest is opened up
            torch.nn.init.normal_(q, std=0.1)
    rng = np.random.default_rng(1)
    base = [_mm_obs(rng) for _ in range(5)]
    red = [{**o, "instruction": "pick up the red cup"} for o in base]
    blue = [{**o, "instruction": "pick up the blue cup"} for o in base]
    with PolicyServer(PolicyHost(policy), port=0) as server, PolicyClient(server.url) as c:
        assert c.info["obs_spec"]["instruction"] == {"dtype": "str", "shape": []}
        got = []
        for steps in (red, blue):
            c.reset(seed=2)
            got.append(np.stack([c.act(o) for o in steps]))
        with pytest.raises(ServerError, match=r"obs\['instruction'\] must be a msgpack str, got int"):
            c.act({**base[0], "instruction": 3})
    for steps, g in zip((red, blue), got, strict=True):
        np.testing.assert_array_equal(g, direct_actions(policy, [(2, steps)])[0])
    assert not np.allclose(got[0], got[1])  # the instruction changed the actions
