"""What an exported chunk graph computes, per policy kind: a registry of small graph builders by ``policy.name``.

Every kind shares the observation side (encoder inputs, normalisation, unnormalised and clipped output); a kind
adds only the noise its chunk draws and how the chunk is made from the condition and that noise:

    inputs   observations raw, To frames: state / joints / force float32 (B, To, dim), rgb uint8 (B, To, 3V, H, W),
             depth float32 (B, To, V, H, W); for an instruction, what the policy's LanguageEncoder hands to fusion:
             instruction_tokens float32 (B, L, D_text) and instruction_mask bool (B, L) (the language model runs
             outside the graph, once per instruction); then the kind's noise inputs, float32 standard normal
    output   chunk float32 (B, Tp, Da): raw actions in the env's units, clipped to [-1, 1]

Noise enters as inputs, so the graph has no random ops and reproduces the torch policy for the same noise.
Adding a policy kind is one :func:`register_graph` call (see the entries at the end of this file).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dmrl.policies import ChunkPolicy
from dmrl.policies.observations import TEXT_KEYS

TEXT_INPUTS = ("instruction_tokens", "instruction_mask")
"""Graph inputs that replace the instruction strings: the LanguageEncoder's tokens (B, L, D_text), mask (B, L)."""

Spec = dict[str, tuple[tuple[int, ...], str]]
"""{input name: (shape, numpy dtype name)} in the graph's argument order."""


@dataclass(frozen=True)
class GraphKind:
    """How one policy kind's chunk becomes a graph."""

    noise: Callable[[ChunkPolicy, int], dict[str, tuple[int, ...]]]
    """(policy, B) -> {input name: shape} of the standard-normal noise its chunk draws, in argument order ({}:
    a deterministic chunk)."""
    chunk: Callable[[ChunkPolicy, Tensor, Tensor | None, dict[str, Tensor]], Tensor]
    """(policy, cond (B, D) or (B, K, D), cond_mask (B, K) or None, noise {name: tensor}) -> normalised chunk
    (B, Tp, Da): what ``sample_chunk`` returns for that noise."""


GRAPH_KINDS: dict[str, GraphKind] = {}
"""policy name -> its graph builder; a plain dict, like policies.POLICIES."""


def register_graph(
    name: str,
    noise: Callable[[ChunkPolicy, int], dict[str, tuple[int, ...]]],
    chunk: Callable[[ChunkPolicy, Tensor, Tensor | None, dict[str, Tensor]], Tensor],
) -> None:
    """Make policies named ``name`` exportable (``dmrl export``, ``OnnxPlanner``)."""
    if name in GRAPH_KINDS:
        raise ValueError(f"register_graph: policy {name!r} already has a graph builder")
    GRAPH_KINDS[name] = GraphKind(noise, chunk)


def graph_kind(policy: ChunkPolicy) -> GraphKind:
    """The registered builder of ``policy``'s kind; a one-line error naming the exportable kinds otherwise."""
    kind = GRAPH_KINDS.get(policy.name)
    if kind is None:
        raise ValueError(
            f"export: no ONNX graph builder for a {policy.name!r} policy (exportable: {', '.join(GRAPH_KINDS)}); "
            "add one with dmrl.export.graphs.register_graph"
        )
    return kind


def text_shape(policy: ChunkPolicy) -> tuple[int, int] | None:
    """(L, D_text) of the instruction tokens the policy's fusion reads; None when it reads no instruction."""
    if not any(k in TEXT_KEYS for k in policy.chunk.obs_keys):
        return None
    text = policy.encoder.text_encoder
    config = getattr(text, "config", None)
    length = getattr(config, "max_tokens", None)
    if length is None:
        raise ValueError(
            f"export: the instruction encoder {type(text).__name__} has no config.max_tokens; export needs a "
            "fixed token count L (models.language.LanguageEncoder pads every instruction to it)"
        )
    return int(length), int(text.out_dim)


def input_spec(policy: ChunkPolicy, batch_size: int) -> Spec:
    """{input name: (shape, numpy dtype name)} of ``policy``'s exported graph, in argument order."""
    to = policy.chunk.n_obs_steps
    spec: Spec = {}
    for k in policy.chunk.obs_keys:
        if k in TEXT_KEYS:
            length, width = text_shape(policy)  # type: ignore[misc]
            spec["instruction_tokens"] = ((batch_size, length, width), "float32")
            spec["instruction_mask"] = ((batch_size, length), "bool")
            continue
        dim = policy.obs_dims[k]
        shape = (batch_size, to, *dim) if isinstance(dim, (tuple, list)) else (batch_size, to, int(dim))
        spec[k] = (shape, "uint8" if k == "rgb" else "float32")
    for name, shape in graph_kind(policy).noise(policy, batch_size).items():
        spec[name] = (tuple(shape), "float32")
    return spec


class _GivenText(nn.Module):
    """Stands in for the LanguageEncoder inside the graph: returns the tokens and mask given as graph inputs."""

    def __init__(self, out_dim: int, tokens: Tensor, mask: Tensor) -> None:
        super().__init__()
        self.out_dim = out_dim
        self.value = (tokens, mask)

    def forward(self, instructions: list[str]) -> tuple[Tensor, Tensor]:
        return self.value


class ChunkGraph(nn.Module):
    """A policy's ``predict_chunk`` with its noise (and instruction embedding) as inputs: (*inputs) -> chunk.

    Inputs in :func:`input_spec` order; output the raw chunk (B, Tp, Da) clipped to [-1, 1].
    """

    def __init__(self, policy: ChunkPolicy) -> None:
        super().__init__()
        self.kind = graph_kind(policy)
        text_shape(policy)  # a text encoder without a fixed L is refused here, before tracing
        self.policy = policy
        spec = input_spec(policy, 1)
        self.names = tuple(spec)
        self.noise_names = tuple(self.kind.noise(policy, 1))

    def forward(self, *inputs: Tensor) -> Tensor:
        values = dict(zip(self.names, inputs, strict=True))
        p = self.policy
        obs: dict[str, Tensor | list[str]] = {k: values[k] for k in p.chunk.obs_keys if k in values}
        noise = {k: values[k] for k in self.noise_names}
        if "instruction_tokens" not in values:
            return self._chunk(obs, noise)
        # The fusion reads the LanguageEncoder's (tokens, mask): swap in a module that returns the given ones, so
        # the graph holds the policy's own fusion code and none of the language model. Restored even on error.
        encoder = p.encoder
        text = encoder.text_encoder
        tokens, mask = values["instruction_tokens"], values["instruction_mask"]
        encoder.text_encoder = _GivenText(int(text.out_dim), tokens, mask)
        try:
            obs["instruction"] = [""] * tokens.shape[0]  # placeholders: the stand-in ignores the strings
            return self._chunk(obs, noise)
        finally:
            encoder.text_encoder = text

    def _chunk(self, obs: dict[str, Tensor | list[str]], noise: dict[str, Tensor]) -> Tensor:
        p = self.policy
        x = self.kind.chunk(p, *p.condition(obs), noise)
        return p.raw_actions(x)


# ---------------------------------------------------------------------------------------------------- the kinds


def _chunk_shape(p: ChunkPolicy, b: int) -> tuple[int, int, int]:
    return (b, p.chunk.horizon, p.action_dim)


def _diffusion_noise(p: ChunkPolicy, b: int) -> dict[str, tuple[int, ...]]:
    noise: dict[str, tuple[int, ...]] = {"init_noise": _chunk_shape(p, b)}
    if p.sampler.stochastic:  # type: ignore[attr-defined]
        noise["step_noise"] = (p.sampler.num_steps, *_chunk_shape(p, b))  # type: ignore[attr-defined]
    return noise


def _diffusion_chunk(p: ChunkPolicy, cond: Tensor, mask: Tensor | None, noise: dict[str, Tensor]) -> Tensor:
    # The policy's own sampling loop, unrolled by tracing (S is a Python int): no Loop node in the graph.
    return p.sample_chunk(cond, mask, init_noise=noise["init_noise"], step_noise=noise.get("step_noise"))  # type: ignore[call-arg]


def _gaussian_chunk(p: ChunkPolicy, cond: Tensor, mask: Tensor | None, noise: dict[str, Tensor]) -> Tensor:
    return p.sample_chunk(cond, mask)  # the mean chunk: nothing drawn


def _vae_noise(p: ChunkPolicy, b: int) -> dict[str, tuple[int, ...]]:
    cfg = p.config  # type: ignore[attr-defined]
    return {"z": (b, cfg.latent_dim)} if cfg.test_z == "sample" else {}


def _vae_chunk(p: ChunkPolicy, cond: Tensor, mask: Tensor | None, noise: dict[str, Tensor]) -> Tensor:
    if "z" not in noise:  # test_z zero: sample_chunk draws nothing
        return p.sample_chunk(cond, mask)
    # sample_chunk draws z itself; this is its decoder step with z given (tests pin it to sample_chunk's output).
    out = p.decoder(torch.cat([cond, noise["z"]], dim=-1))  # type: ignore[attr-defined, operator]
    return out.reshape(cond.shape[0], p.chunk.horizon, p.action_dim)


def _student_noise(p: ChunkPolicy, b: int) -> dict[str, tuple[int, ...]]:
    noise: dict[str, tuple[int, ...]] = {"init_noise": _chunk_shape(p, b)}
    if len(p.starts) > 1:  # type: ignore[attr-defined]  # two steps: the re-noising draw of each later call
        noise["step_noise"] = (len(p.starts) - 1, *_chunk_shape(p, b))  # type: ignore[attr-defined]
    return noise


register_graph("diffusion", _diffusion_noise, _diffusion_chunk)
register_graph("gaussian", lambda p, b: {}, _gaussian_chunk)
register_graph("vae", _vae_noise, _vae_chunk)
# The distilled student (policies/student.py): noise (B, Tp, Da) -> chunk in one or two calls of its network; its
# sample_chunk takes the noise as the diffusion policy's does.
register_graph("student", _student_noise, _diffusion_chunk)
