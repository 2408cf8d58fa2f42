"""Every registered policy on the multimodal encoder: contract, token conditions, gradients, act history, save/load.

Tiny everything (16 x 16 images, D = 32, one block per network); the real MiniLM is built once for the module,
frozen (trainable_layers=0), and shared by the policies that read an instruction.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from teachers import student_config, with_teacher

from dmrl.data import Normalizer
from dmrl.models import (
    DENOISERS,
    DepthConfig,
    LanguageConfig,
    LanguageEncoder,
    MultimodalEncoderConfig,
    PerceiverConfig,
    ViTConfig,
)
from dmrl.policies import POLICIES, ChunkConfig, DiffusionPolicyConfig, build_policy
from dmrl.policies.checkpoint import load_policy, save_policy
from dmrl.policies.gaussian import GaussianPolicyConfig
from dmrl.policies.vae import VAEPolicyConfig

B, TO, TP, TA, DA, HW = 4, 2, 8, 4, 3, 16
DIMS = {"rgb": (3, HW, HW), "depth": (1, HW, HW), "joints": 6, "force": 4}
IMAGES = ("rgb", "depth", "joints", "force")
ALL = (*IMAGES, "instruction")
LANG = LanguageConfig(out_dim=32, trainable_layers=0)
TEXTS = ("pick up the red cup", "move the blue mug to the pad", "grab the green cup", "put the red cup on the mat")


def tiny_chunk(keys: tuple[str, ...] = ALL, **multimodal) -> ChunkConfig:
    tiny = {
        "dim": 32,
        "vit": ViTConfig(width=32, depth=1, n_heads=2, patch_size=8),
        "depth": DepthConfig(width=16, depth=1, n_heads=2, patch_size=8),
        "perceiver": PerceiverConfig(n_latents=4, n_heads=2, n_layers=1),
        "concat_hidden": 32,
        "language": LANG,
    }
    mm = MultimodalEncoderConfig(**{**tiny, **multimodal})
    return ChunkConfig(obs_keys=keys, n_obs_steps=TO, horizon=TP, n_action_steps=TA, encoder=mm)


DENOISER_KW = {
    "mlp": {"hidden_dim": 32, "n_blocks": 1},
    "unet": {"down_dims": [16, 32], "n_groups": 8},
    "transformer": {"d_model": 32, "n_layers": 1, "n_heads": 2},
}


def tiny_config(name: str, denoiser: str = "transformer"):
    if name == "diffusion":
        kw = DENOISER_KW[denoiser]
        return DiffusionPolicyConfig(denoiser=denoiser, denoiser_kwargs=kw, num_train_steps=10, num_inference_steps=2)
    if name == "gaussian":
        return GaussianPolicyConfig(hidden=32, depth=1)
    if name == "student":
        return student_config(**DENOISER_KW[denoiser])
    return VAEPolicyConfig(hidden=32, depth=1, latent_dim=4)


#: (policy, denoiser) pairs: every registered policy, the diffusion one with every denoiser.
CASES = [("diffusion", d) for d in DENOISERS] + [(n, None) for n in sorted(POLICIES) if n != "diffusion"]
assert {n for n, _ in CASES} == set(POLICIES)


@pytest.fixture(scope="module")
def text() -> Iterator[LanguageEncoder]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors; other jobs share the cores and OpenMP barriers stall under contention
    torch.manual_seed(0)
    yield LanguageEncoder(LANG)
    torch.set_num_threads(before)


def make(name: str, denoiser: str | None, text=None, keys=ALL, norm=None, **multimodal):
    torch.manual_seed(0)
    chunk = tiny_chunk(keys, **multimodal)
    te = text if "instruction" in keys else None
    return with_teacher(
        build_policy(name, chunk, tiny_config(name, denoiser or "mlp"), DIMS, DA, norm, text_encoder=te)
    )


def obs_batch(b: int = B, seed: int = 0, keys=ALL) -> dict:
    g = torch.Generator().manual_seed(seed)
    obs = {
        "rgb": torch.randint(0, 256, (b, TO, 3, HW, HW), generator=g, dtype=torch.uint8),
        "depth": torch.rand(b, TO, 1, HW, HW, generator=g) * 2.0,
        "joints": torch.randn(b, TO, 6, generator=g),
        "force": torch.randn(b, TO, 4, generator=g),
        "instruction": [TEXTS[i % len(TEXTS)] for i in range(b)],
    }
    return {k: v for k, v in obs.items() if k in keys}


def batch(b: int = B, seed: int = 0, keys=ALL) -> dict:
    g = torch.Generator().manual_seed(seed + 1)
    return {
        "obs": obs_batch(b, seed, keys),
        "action": torch.rand(b, TP, DA, generator=g) * 2 - 1,
        "action_mask": torch.ones(b, TP, dtype=torch.bool),
    }


def env_step(b: int | None, seed: int = 0, text_of=lambda i: TEXTS[i % len(TEXTS)]) -> dict:
    """One env step as the env (b None) or the vector env (b envs) returns it: numpy arrays, str / tuple of str."""
    rng = np.random.default_rng(seed)
    n = 1 if b is None else b
    obs = {
        "rgb": rng.integers(0, 256, (n, 3, HW, HW), dtype=np.uint8),
        "depth": rng.uniform(0, 2, (n, 1, HW, HW)).astype(np.float32),
        "joints": rng.normal(size=(n, 6)).astype(np.float32),
        "force": rng.normal(size=(n, 4)).astype(np.float32),
        "instruction": tuple(text_of(i) for i in range(n)),
    }
    if b is None:
        return {k: v[0] for k, v in obs.items()}
    return obs


@pytest.mark.parametrize(("name", "denoiser"), CASES)
def test_every_policy_trains_predicts_and_acts_on_images_proprio_and_text(name, denoiser, text):
    policy = make(name, denoiser, text)
    geometry = policy.encoder.geometry
    assert geometry.image_size == (HW, HW) and geometry.joints_dim == 6 and geometry.modalities == ALL
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    for step in range(2):  # the diffusion denoiser's output layer starts at zero: one step opens the path
        out = policy.loss(batch(seed=step))
        assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    policy.eval()
    cond, mask = policy.condition(obs_batch(3))
    token_cond = name == "diffusion" and denoiser == "transformer"
    assert cond.shape == ((3, 4, 32) if token_cond else (3, 32)) and (mask is not None) == token_cond
    chunk = policy.predict_chunk(obs_batch(3))
    assert chunk.shape == (3, TP, DA) and chunk.abs().max() <= 1.0
    dropped = policy.predict_chunk(obs_batch(3, keys=("rgb", "joints", "instruction")))  # depth, force masked
    assert dropped.shape == (3, TP, DA) and torch.isfinite(dropped).all()
    a = policy.act(env_step(None))
    assert a.shape == (DA,) and a.dtype == np.float32
    policy.reset()
    for t in range(TA + 1):  # crosses a replan
        a = policy.act(env_step(2, seed=t))
        assert a.shape == (2, DA) and np.isfinite(a).all()
    policy.reset(mask=np.array([False, True]))
    assert policy.act(env_step(2, seed=9)).shape == (2, DA)


def test_gradients_reach_encoders_but_not_the_frozen_language_model(text):
    policy = make("diffusion", "transformer", text)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    for step in range(2):
        opt.zero_grad()
        policy.loss(batch(seed=step))["loss"].backward()
        opt.step()
    grads = {n: p.grad for n, p in policy.named_parameters()}
    minilm = [n for n in grads if n.startswith("encoder.text_encoder.minilm.")]
    assert minilm and all(grads[n] is None for n in minilm), "trainable_layers=0: no MiniLM weight gets a gradient"
    for prefix in (
        "encoder.frames.rgb.encoder.backbone.",
        "encoder.frames.depth.encoder.backbone.",
        "encoder.proprio.proj.joints.",
        "encoder.proprio.proj.force.",
        "encoder.text_proj.",
        "encoder.text_encoder.proj.",
        "encoder.fusion.",
        "denoiser.",
    ):
        hit = [g for n, g in grads.items() if n.startswith(prefix)]
        assert hit and any(g is not None and g.abs().sum() > 0 for g in hit), f"no gradient reaches {prefix}"


def test_frozen_vit_backbone_gets_no_gradient():
    policy = make("gaussian", None, keys=IMAGES, vit=ViTConfig(width=32, depth=1, n_heads=2, patch_size=8, freeze=True))
    policy.loss(batch(keys=IMAGES))["loss"].backward()
    named = dict(policy.named_parameters())
    assert all(p.grad is None for n, p in named.items() if n.startswith("encoder.frames.rgb.encoder.backbone."))
    assert named["encoder.frames.rgb.encoder.head.proj.weight"].grad is not None


def test_act_keeps_uint8_frames_and_the_latest_instruction_per_env(text):
    policy = make("gaussian", None, text)
    seen: list[dict] = []
    original = policy.predict_chunk

    def spy(obs):
        seen.append(obs)
        return original(obs)

    policy.predict_chunk = spy
    policy.act(env_step(2, seed=0))
    first = seen[-1]
    assert first["rgb"].dtype == torch.uint8 and first["rgb"].shape == (2, TO, 3, HW, HW)
    assert first["depth"].dtype == torch.float32 and first["joints"].shape == (2, TO, 6)
    assert first["instruction"] == [TEXTS[0], TEXTS[1]]
    assert torch.equal(first["rgb"][:, 0], first["rgb"][:, 1]), "a fresh episode repeats its first frame"
    policy.act(env_step(2, seed=1))
    policy.reset(mask=np.array([False, True]))
    new = env_step(2, seed=2, text_of=lambda i: "grab the blue cup" if i else TEXTS[0])
    policy.act(new)
    replanned = seen[-1]
    assert replanned["instruction"] == ["grab the blue cup"], "only the reset env replans, with its new instruction"
    assert torch.equal(replanned["rgb"][0, 0], torch.from_numpy(new["rgb"][1])), "reset env: history = new frame"
    assert torch.equal(replanned["rgb"][0, 1], torch.from_numpy(new["rgb"][1]))


def test_save_load_gives_identical_actions(tmp_path):
    norm = Normalizer()
    norm.set("joints", np.full(6, 0.5), np.zeros(6), "limits")
    norm.set("force", np.full(4, 0.1), np.full(4, 0.2), "limits")
    norm.set("actions", np.full(DA, 2.0), np.full(DA, 0.1), "limits")
    policy = make("diffusion", "transformer", keys=IMAGES, norm=norm).eval()
    save_policy(tmp_path / "ckpt", policy, {"env_id": "x"})
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["obs_dims"] == {"rgb": [3, HW, HW], "depth": [1, HW, HW], "joints": 6, "force": 4}
    assert saved["format"] == 2 and saved["chunk"]["encoder"]["type"] == "multimodal"
    assert "image_size" not in saved["chunk"]["encoder"], "geometry comes from obs_dims, not the config"
    loaded, _ = load_policy(tmp_path / "ckpt")
    assert loaded.chunk == policy.chunk
    actions = []
    for p in (policy, loaded):
        p.reset()
        torch.manual_seed(3)
        actions.append(np.stack([p.act(env_step(2, seed=t)) for t in range(TA + 1)]))
    assert np.array_equal(actions[0], actions[1])


def test_checkpoint_without_encoder_keys_still_loads(tmp_path):
    """A format-1 lowdim checkpoint written before chunk.encoder_type / multimodal / language existed."""
    policy = build_policy("gaussian", ChunkConfig(), GaussianPolicyConfig(hidden=32, depth=1), {"state": 5}, DA)
    save_policy(tmp_path / "old", policy)
    path = tmp_path / "old" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["format"] = 1
    cfg["chunk"]["encoder"].pop("type")
    path.write_text(json.dumps(cfg))
    loaded, _ = load_policy(tmp_path / "old")
    assert loaded.chunk.encoder_type == "lowdim" and loaded.obs_dims == {"state": 5}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"obs_keys": ("rgb", "joints")}, "rgb need chunk.encoder.type multimodal"),
        ({"obs_keys": ("joints", "instruction")}, "instruction need chunk.encoder.type multimodal"),
        ({"obs_keys": ("rgb", "state"), "encoder": MultimodalEncoderConfig()}, "state is not read by the multimodal"),
        ({"encoder": LanguageConfig()}, "chunk.encoder: got LanguageConfig; allowed: lowdim, multimodal"),
        ({"obs_keys": ("rgb", "rgb"), "encoder": MultimodalEncoderConfig()}, "distinct names"),
    ],
)
def test_bad_key_and_encoder_combinations_are_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        ChunkConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_obs_dims_must_give_frame_shapes():
    cfg = tiny_config("gaussian")
    with pytest.raises(ValueError, match=r"obs_dims\['rgb'\]: got 768; expected the frame shape"):
        build_policy("gaussian", tiny_chunk(("rgb",)), cfg, {"rgb": 768}, DA)
    with pytest.raises(KeyError, match="no entry for 'depth'"):
        build_policy("gaussian", tiny_chunk(("rgb", "depth")), cfg, {"rgb": (3, HW, HW)}, DA)
    with pytest.raises(ValueError, match="disagree on cameras"):
        build_policy("gaussian", tiny_chunk(("rgb", "depth")), cfg, {"rgb": (3, HW, HW), "depth": (2, HW, HW)}, DA)


def aux_policy(name: str, text, weight: float = 1.0, keys=ALL):
    """A policy with a 3-entry auxiliary head over a 5-entry privileged state, and a batch carrying that state."""
    norm = Normalizer()
    norm.set("joints", np.full(6, 0.5), np.zeros(6), "limits")
    norm.set("force", np.full(4, 0.1), np.full(4, 0.2), "limits")
    norm.set("state", np.arange(1.0, 6.0), np.full(5, -0.5), "limits")
    norm.set("actions", np.full(DA, 2.0), np.full(DA, 0.1), "limits")
    torch.manual_seed(0)
    chunk = dataclasses.replace(tiny_chunk(keys), aux_state=(4, 0, 2), aux_weight=weight)
    te = text if "instruction" in keys else None
    policy = with_teacher(build_policy(name, chunk, tiny_config(name, "mlp"), DIMS, DA, norm, text_encoder=te))
    b = batch(keys=keys)
    b["obs"]["state"] = torch.randn(B, TO, 5)
    return policy, b


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_aux_state_loss_is_the_heads_mse_on_normalised_state_and_trains_the_encoder(name, text):
    policy, b = aux_policy(name, text, weight=0.5)
    out = policy.loss(b)
    pooled = policy.encode(b["obs"])
    target = b["obs"]["state"][:, -1, [4, 0, 2]] * torch.tensor([5.0, 1.0, 3.0]) - 0.5
    expected = ((policy.aux_head(pooled) - target) ** 2).mean()
    torch.testing.assert_close(out["aux"], expected.detach())
    policy.zero_grad()
    (0.5 * policy.aux_loss(b, policy.encode(b["obs"]))).backward()
    assert policy.aux_head.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.encoder.parameters())
    del b["obs"]["state"]
    with pytest.raises(KeyError, match="no obs 'state'"):
        policy.loss(b)


def test_aux_state_policy_acts_without_state_and_round_trips(tmp_path, text):
    policy, _ = aux_policy("diffusion", None, keys=IMAGES)
    policy.eval()
    save_policy(tmp_path / "ckpt", policy, {"env_id": "x"})
    loaded, _ = load_policy(tmp_path / "ckpt")
    assert loaded.chunk.aux_state == (4, 0, 2)
    assert torch.equal(loaded.aux_scale, torch.tensor([5.0, 1.0, 3.0]))
    actions = []
    for p in (policy, loaded):
        p.reset()
        torch.manual_seed(3)
        step = {k: v for k, v in env_step(2).items() if k in IMAGES}  # no state key: the policy never reads it
        actions.append(p.act(step))
    assert np.array_equal(actions[0], actions[1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"obs_keys": ("state",), "aux_state": (1,)}, "already reads state"),
        ({"aux_state": (1, 1)}, "distinct indices"),
        ({"aux_state": (-1,)}, "distinct indices"),
        ({"aux_state": (1,), "aux_weight": -1.0}, "aux_weight"),
        ({"pad_after": 15}, "chunk.pad_after"),  # Tp - To = 14 at the defaults
        ({"pad_after": -1}, "chunk.pad_after"),
    ],
)
def test_bad_chunk_training_settings_are_one_line_errors(kwargs, match):
    kwargs = {"obs_keys": ("joints",), **kwargs}
    with pytest.raises(ValueError, match=match) as err:
        ChunkConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_aux_state_index_past_the_state_is_an_error(text):
    norm = Normalizer()
    norm.set("state", np.ones(5), np.zeros(5), "limits")
    norm.set("actions", np.ones(DA), np.zeros(DA), "limits")
    chunk = ChunkConfig(obs_keys=("joints",), aux_state=(5,))
    norm.set("joints", np.ones(6), np.zeros(6), "limits")
    with pytest.raises(ValueError, match="index 5 out of range; the state has 5 entries"):
        build_policy("gaussian", chunk, tiny_config("gaussian"), {"joints": 6}, DA, norm)


def test_a_frozen_student_encoder_stays_in_eval_mode_and_shares_the_teachers_encoding():
    """Distilling with the encoder frozen (dmrl distill's default): its modality dropout stays off in training (it
    would corrupt the condition the teacher labels), and the teacher's chain reuses the student's encoding, which
    gives the same labels and loss as encoding twice."""
    student = make("student", "mlp", keys=IMAGES, modality_dropout=0.5)
    teacher = student._teacher.module
    student.copy_teacher(teacher)
    student.freeze_encoder()
    student.train()
    assert not student.encoder.training and student.denoiser.training
    assert not any(p.requires_grad for p in student.encoder.parameters())
    assert student._shares_encoder
    # Weights loaded later (a resumed state) decide again.
    state = {k: v.clone() for k, v in student.state_dict().items()}
    state[next(k for k in state if k.startswith("encoder.") and state[k].is_floating_point())] += 0.1
    student.load_state_dict(state)
    assert not student._shares_encoder
    student.copy_teacher(teacher)
    assert student._shares_encoder
    b = batch(keys=IMAGES)
    teacher_encodings = []
    hook = teacher.encoder.register_forward_hook(lambda *_: teacher_encodings.append(1))
    torch.manual_seed(5)
    shared = student.loss(b)["loss"]
    assert teacher_encodings == []  # one encoding, the student's, served the teacher's chain
    student._shares_encoder = False
    torch.manual_seed(5)
    twice = student.loss(b)["loss"]
    hook.remove()
    assert teacher_encodings == [1]
    torch.testing.assert_close(shared, twice)
    # R noises per observation: R adjacent chains from one condition, the same loss shared or not.
    student.noise_samples = 3
    seen = []
    chain = student.teacher_chain
    student.teacher_chain = lambda obs, z, cond=None: seen.append((z, cond)) or chain(obs, z, cond)
    losses = []
    for share in (True, False):
        student._shares_encoder = share
        torch.manual_seed(6)
        losses.append(student.loss(b)["loss"])
    torch.testing.assert_close(losses[0], losses[1])
    (z, cond), (_, none) = seen
    assert z.shape[0] == 3 * B and none is None
    assert torch.equal(cond[0][0], cond[0][2]) and not torch.equal(cond[0][2], cond[0][3])
    del student.teacher_chain
    student.noise_samples = 1
    # Train mode with dropout would have given another condition than the teacher's: the same batch, the same
    # pooled vector, in every call.
    torch.testing.assert_close(student.encode(b["obs"]), teacher.encode(b["obs"]))
    # A student whose encoder differs from the teacher's encodes for itself.
    other = make("student", "mlp", keys=IMAGES, modality_dropout=0.5)
    other.copy_teacher(other._teacher.module)
    with torch.no_grad():
        next(other.encoder.parameters()).add_(0.1)
    other.freeze_encoder()
    assert not other._shares_encoder


def test_visited_windows_replace_only_the_observations_the_student_reads():
    from dmrl.algos.distill import mix_windows

    b = batch(keys=IMAGES)
    b["obs"]["state"] = torch.randn(B, TO, 5)  # an auxiliary head's labels: the visited windows have none
    windows = {k: v.numpy() + 1 for k, v in obs_batch(3, seed=7, keys=IMAGES).items()}
    mixed = mix_windows(b, windows, 0.5, torch.Generator().manual_seed(0), keys=IMAGES)
    assert mixed["obs"]["state"] is b["obs"]["state"]
    assert not torch.equal(mixed["obs"]["joints"][:2], b["obs"]["joints"][:2])
    assert torch.equal(mixed["obs"]["joints"][2:], b["obs"]["joints"][2:])
    with pytest.raises(ValueError, match="no 'state'"):
        mix_windows(b, windows, 0.5, torch.Generator().manual_seed(0))
