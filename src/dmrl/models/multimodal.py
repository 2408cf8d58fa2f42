"""MultimodalEncoder: an observation dict -> per-modality tokens -> fusion (models/fusion.py) -> condition tokens.

    obs {rgb, depth, joints, force, instruction} -> per-modality tokens (B, N_i, D) + masks (B, N_i)
        -> fusion -> EncoderOutput(tokens (B, K, D), mask (B, K), pooled (B, D), present {name: (B,) bool})

Missing modalities are masks, never zero-filled inputs: a modality absent from obs, blanked per sample, or dropped at
training time (modality_dropout) contributes no token to the fusion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmrl.models.depth import DepthConfig, DepthEncoder
from dmrl.models.fusion import ConcatFusion, PerceiverConfig, PerceiverFusion
from dmrl.models.language import LanguageConfig
from dmrl.models.resnet import ResNet18GN, ResNetGNConfig
from dmrl.models.tokens import FrameTokenizer, ProprioTokenizer
from dmrl.models.vit import ViTConfig, ViTEncoder

MODALITIES = ("rgb", "depth", "joints", "force", "instruction")
FUSIONS = ("perceiver", "concat")


@dataclass
class EncoderOutput:
    """What the policy conditions on."""

    tokens: Tensor
    """(B, K, D) condition tokens (K = n_latents for the Perceiver, 1 for concat)."""
    mask: Tensor
    """(B, K) bool, True = valid (all True: fusion outputs are never padding)."""
    pooled: Tensor
    """(B, D) one condition vector."""
    present: dict[str, Tensor]
    """{modality: (B,) bool}: the modality reached the fusion for that sample (in obs, not masked, not dropped)."""


@dataclass(frozen=True)
class MultimodalGeometry:
    """What the data decides about the multimodal encoder: read off the policy's observation keys, To and the
    store's shapes when the policy is built (policies.observations.multimodal_geometry), never set by a flag."""

    modalities: tuple[str, ...] = ("rgb", "depth", "joints", "force")
    """Any non-empty subset of rgb, depth, joints, force, instruction (instruction needs a text encoder)."""
    n_obs_steps: int = 2
    """To: observation frames per sample."""
    image_size: tuple[int, int] = (64, 64)
    """(H, W) of rgb and depth frames."""
    n_cameras: int = 1
    """Cameras stacked on channels: rgb (3 * n_cameras, H, W), depth (n_cameras, H, W)."""
    joints_dim: int = 6
    """J: joint readings per frame."""
    force_dim: int = 4
    """F: force readings per frame."""

    def __post_init__(self) -> None:
        chosen = tuple(self.modalities)
        bad = [m for m in chosen if m not in MODALITIES]
        if not chosen or bad or len(set(chosen)) != len(chosen):
            raise ValueError(f"MultimodalGeometry.modalities: got {chosen}; allowed distinct names of {MODALITIES}")
        # canonical order: the token layout is fixed
        object.__setattr__(self, "modalities", tuple(m for m in MODALITIES if m in chosen))
        object.__setattr__(self, "image_size", tuple(self.image_size))
        for key in ("n_obs_steps", "n_cameras", "joints_dim", "force_dim"):
            if getattr(self, key) < 1:
                raise ValueError(f"MultimodalGeometry.{key}: got {getattr(self, key)}; allowed an integer >= 1")


@dataclass
class MultimodalExperimental:
    """Experimental: tried, not adopted by any preset (see docs/experiments); kept for further experiments."""

    instruction_pool: str = "mean"
    """How the instruction becomes one vector for the queries and FiLM: mean (of its valid tokens) or attention (a
    learned query, softmax over the valid tokens, zero-initialised so it starts as the mean)."""

    def __post_init__(self) -> None:
        if self.instruction_pool not in ("mean", "attention"):
            raise ValueError(
                f"encoder.experimental.instruction_pool: got {self.instruction_pool!r}; allowed mean or attention"
            )


@dataclass
class MultimodalEncoderConfig:
    """Per-modality encoders of width D, fused into condition tokens. Modalities, To, image size, cameras, J and F
    come from the data (MultimodalGeometry)."""

    dim: int = 256
    """D: width of every token and of the output."""
    image_obs_steps: int | None = None
    """Frames of rgb and depth that are encoded: the most recent ones of the To given (None: all To). Joints and
    force keep all To; 1 halves the image encoders' cost at To 2, for scenes where the second image adds little."""
    rgb_encoder: str = "vit"
    """vit (ViTEncoder, config in `vit`) or resnet (ResNet18GN with spatial softmax, config in `resnet`)."""
    vit: ViTConfig = field(default_factory=ViTConfig)
    resnet: ResNetGNConfig = field(default_factory=ResNetGNConfig)
    depth: DepthConfig = field(default_factory=DepthConfig)
    fusion: str = "perceiver"
    """perceiver (K latent tokens, config in `perceiver`) or concat (pooled vectors + MLP)."""
    perceiver: PerceiverConfig = field(default_factory=PerceiverConfig)
    concat_hidden: int = 512
    """Hidden width of the concat fusion's MLP."""
    language: LanguageConfig = field(default_factory=LanguageConfig)
    """Instruction encoder (MiniLM), used when instruction is among the observation keys."""
    modality_dropout: float = 0.0
    """Training only: per sample, each modality is masked out with this probability; one always stays."""
    instruction_token_dropout: float = 0.0
    """Training only: per sample, each of the instruction's real tokens is masked out with this probability, one
    always staying (word dropout, before every use of the instruction), so the policy does not memorise wordings."""
    instruction_queries: bool = False
    """Perceiver only: the instruction's mean token, through a linear map, is added to every latent query, so the
    cross-attention can read the image conditionally (find the named object). A missing instruction adds nothing."""
    instruction_film: bool = False
    """rgb_encoder resnet only: FiLM (RT-1, BC-Z) of the last ResNet feature map by the instruction's mean token,
    features * (1 + gamma) + beta, before the spatial softmax; zero-initialised (the plain encoder at start)."""
    proprio_skip: bool = False
    """Also add a linear map of the To frames of joints and force onto the fused output (every latent and the pooled
    vector), as Diffusion Policy concatenates low-dim state to its image features; a missing modality adds nothing."""
    experimental: MultimodalExperimental = field(default_factory=MultimodalExperimental)
    """Experimental knobs, not used by any preset."""

    def __post_init__(self) -> None:
        for key in ("dim", "concat_hidden"):
            if getattr(self, key) < 1:
                raise ValueError(f"MultimodalEncoderConfig.{key}: got {getattr(self, key)}; allowed an integer >= 1")
        if self.image_obs_steps is not None and self.image_obs_steps < 1:
            raise ValueError(
                f"MultimodalEncoderConfig.image_obs_steps: got {self.image_obs_steps}; allowed None (all To) or >= 1"
            )
        if self.rgb_encoder not in ("vit", "resnet"):
            raise ValueError(f"MultimodalEncoderConfig.rgb_encoder: got {self.rgb_encoder!r}; allowed vit or resnet")
        if self.fusion not in FUSIONS:
            raise ValueError(f"MultimodalEncoderConfig.fusion: got {self.fusion!r}; allowed {' or '.join(FUSIONS)}")
        for key in ("modality_dropout", "instruction_token_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"MultimodalEncoderConfig.{key}: got {getattr(self, key)}; allowed [0, 1)")


def drop_modalities(keep: Tensor, p: float) -> Tensor:
    """Modality (or token) dropout: keep (B, n) bool -> keep with each True entry dropped with probability p,
    except that a sample which had any True entry keeps at least one (a random one of those). Branch-free."""
    dropped = keep & ~(torch.rand(keep.shape, device=keep.device) < p)
    score = torch.where(keep, torch.rand(keep.shape, device=keep.device), -1.0)
    rescue = F.one_hot(score.argmax(dim=1), keep.shape[1]).bool() & keep  # one random available modality
    return dropped | (rescue & ~dropped.any(dim=1, keepdim=True))


class MultimodalEncoder(nn.Module):
    """Observation dict -> EncoderOutput: per-modality tokens of width D, concatenated with masks, then fused.

    obs: rgb uint8 (B, To, 3 * n_cams, H, W), depth float32 (B, To, n_cams, H, W) metres, joints (B, To, J)
    and force (B, To, F) already normalised, instruction a list of B strings. Other keys are ignored.
    A configured modality missing from obs is masked out for every sample (its slot holds masked zeros, so the
    fusion input keeps its shape); `present` {name: (B,) bool} masks single samples. Either way the output is
    what it would be for any other values of that modality: missing is never zero-filled data.
    geometry: the modalities, To, image size, cameras, J and F (read off the data by the policy).
    text_encoder: for `instruction`, a module mapping list[str] -> (tokens (B, L, D_text), mask (B, L) bool)
    with an `out_dim` attribute (models.language.LanguageEncoder); its tokens are projected to D here.
    """

    def __init__(
        self,
        config: MultimodalEncoderConfig | None = None,
        geometry: MultimodalGeometry | None = None,
        text_encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        c = self.config = config or MultimodalEncoderConfig()
        g = self.geometry = geometry or MultimodalGeometry()
        d, to = c.dim, g.n_obs_steps
        self.image_steps = ti = c.image_obs_steps or to
        if ti > to:
            raise ValueError(f"MultimodalEncoderConfig.image_obs_steps: got {ti}; allowed at most To = {to}")
        geometry = {"out_dim": d, "image_size": g.image_size, "n_cameras": g.n_cameras}
        self.frames = nn.ModuleDict()
        if "rgb" in g.modalities:
            rgb = ViTEncoder(c.vit, **geometry) if c.rgb_encoder == "vit" else ResNet18GN(c.resnet, **geometry)
            self.frames["rgb"] = FrameTokenizer(rgb, ti)
        if "depth" in g.modalities:
            self.frames["depth"] = FrameTokenizer(DepthEncoder(c.depth, **geometry), ti)
        low = {k: getattr(g, f"{k}_dim") for k in ("joints", "force") if k in g.modalities}
        self.proprio = ProprioTokenizer(low, to, d) if low else None
        self.skip = nn.ModuleDict({k: nn.Linear(to * n, d) for k, n in low.items()}) if c.proprio_skip else None
        # Token count per modality, for the masked placeholder of a missing one. An instruction's length is
        # only known once tokenized, so its placeholder is a single masked token.
        self.n_tokens = {k: m.n_tokens for k, m in self.frames.items()} | dict.fromkeys(low, to)
        self.text_encoder = None
        if "instruction" in g.modalities:
            if text_encoder is None:
                raise ValueError("MultimodalEncoder: modality 'instruction' needs text_encoder= (a LanguageEncoder)")
            self.text_encoder = text_encoder
            self.text_proj = nn.Linear(int(text_encoder.out_dim), d)
            self.text_embed = nn.Parameter(torch.zeros(d))  # modality embedding (an instruction has no frames)
            nn.init.trunc_normal_(self.text_embed, std=0.02)
            self.n_tokens["instruction"] = 1
            if c.experimental.instruction_pool == "attention":
                self.text_pool = nn.Parameter(torch.zeros(d))  # zero: uniform weights, the mean, at start
            if c.instruction_queries and c.fusion == "perceiver":
                self.text_query = nn.Linear(d, d)
        elif text_encoder is not None:
            raise ValueError("MultimodalEncoder: text_encoder given but 'instruction' is not among the modalities")
        self.film = None
        if c.instruction_film:
            if "instruction" not in g.modalities or "rgb" not in g.modalities or c.rgb_encoder != "resnet":
                raise ValueError(
                    "MultimodalEncoderConfig.instruction_film needs modalities rgb and instruction and "
                    "rgb_encoder resnet"
                )
            self.film = nn.Linear(d, 2 * c.resnet.widths[-1])
            nn.init.zeros_(self.film.weight)  # starts as the identity FiLM: the plain encoder
            nn.init.zeros_(self.film.bias)
        self.fusion: nn.Module = (
            PerceiverFusion(c.perceiver, dim=d)
            if c.fusion == "perceiver"
            else ConcatFusion(len(g.modalities), d, c.concat_hidden)
        )
        self.out_dim = d

    def _batch_size(self, obs: Mapping[str, Tensor | Sequence[str]]) -> int:
        sizes = {k: len(v) if isinstance(v, list | tuple) else v.shape[0] for k, v in obs.items() if k in self.n_tokens}
        if not sizes:
            raise ValueError(f"MultimodalEncoder: obs has none of {self.geometry.modalities}; got keys {sorted(obs)}")
        if len(set(sizes.values())) > 1:
            raise ValueError(f"MultimodalEncoder: batch sizes differ across modalities: {sizes}")
        return next(iter(sizes.values()))

    def _encode(self, name: str, value: Tensor | Sequence[str], film: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One modality -> (tokens (B, N, D), mask (B, N) bool); film (B, 2C) modulates the rgb encoder's features."""
        if name == "instruction":
            assert self.text_encoder is not None
            if isinstance(value, str) or not all(isinstance(s, str) for s in value):
                raise ValueError("MultimodalEncoder: instruction must be a list of B strings")
            tokens, mask = self.text_encoder(list(value))
            return self.text_proj(tokens) + self.text_embed, mask.to(torch.bool)
        assert isinstance(value, Tensor)
        if name in self.frames:
            to = self.geometry.n_obs_steps
            if value.ndim != 5 or value.shape[1] != to:
                raise ValueError(
                    f"MultimodalEncoder: got {name} of shape {tuple(value.shape)}; expected (B, {to}, C, H, W)"
                )
            tokens = self.frames[name](value[:, to - self.image_steps :], film)
        else:
            assert self.proprio is not None
            tokens = self.proprio(name, value)
        return tokens, torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)

    @staticmethod
    def _blank(value: Tensor | Sequence[str], flags: Tensor | None) -> Tensor | Sequence[str]:
        """Zero the raw values of samples the caller masked. The fusion never sees them either way, but a NaN
        there would still reach the encoder's weight gradients as 0 * NaN."""
        if flags is None or not isinstance(value, Tensor):
            return value
        keep = flags.to(device=value.device, dtype=torch.bool).view(-1, *([1] * (value.ndim - 1)))
        return torch.where(keep, value, torch.zeros((), dtype=value.dtype, device=value.device))

    def _from_instruction(self, linear: nn.Module, tokens: Tensor, mask: Tensor) -> Tensor:
        """linear(pool of the valid instruction tokens) (B, out), exactly zero for a sample with none valid.

        tokens (B, L, D), mask (B, L) bool with every exclusion already in it (caller masks, modality dropout,
        a missing key), so a masked instruction contributes nothing through this path either. The pool is the
        mean, or with experimental.instruction_pool attention a softmax over the valid tokens (in fp32, as the
        fusion's)."""
        m = mask[..., None]
        zero = torch.zeros((), dtype=tokens.dtype, device=tokens.device)
        if hasattr(self, "text_pool"):
            scores = (tokens.float() @ self.text_pool.float()) / tokens.shape[-1] ** 0.5  # (B, L)
            # A finite fill, not -inf: a sample with no valid token gets finite weights (zeroed below), so no NaN
            # reaches text_pool's gradient through the softmax.
            weights = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=1)
            weights = torch.where(mask, weights, torch.zeros((), device=weights.device))
            pooled = (weights[..., None] * tokens.float()).sum(1).to(tokens.dtype)
        else:
            pooled = torch.where(m, tokens, zero).sum(1) / m.sum(1).clamp_min(1).to(tokens.dtype)
        out = linear(pooled)
        return torch.where(mask.any(1, keepdim=True), out, torch.zeros((), dtype=out.dtype, device=out.device))

    def _proprio_skip(self, blanked: Mapping[str, Tensor | Sequence[str]], keep: Tensor, ref: Tensor) -> Tensor:
        """(B, D): the sum over joints / force of Linear(their To frames flattened), zero where the modality is
        masked, dropped or missing (`where`, not a product, so masked NaN values cannot leak)."""
        assert self.skip is not None
        out = torch.zeros_like(ref)
        for i, name in enumerate(self.geometry.modalities):
            if name in self.skip and name in blanked:
                value = blanked[name]
                assert isinstance(value, Tensor)
                term = self.skip[name](value.flatten(1).to(ref.dtype))
                out = out + torch.where(keep[:, i, None], term, torch.zeros((), dtype=term.dtype, device=term.device))
        return out

    def forward(
        self, obs: Mapping[str, Tensor | Sequence[str]], present: Mapping[str, Tensor] | None = None
    ) -> EncoderOutput:
        c, g, present = self.config, self.geometry, present or {}
        unknown = sorted(set(present) - set(g.modalities))
        if unknown:
            raise ValueError(f"MultimodalEncoder: present names {unknown} are not configured modalities {g.modalities}")
        b = self._batch_size(obs)
        for name, flags in present.items():
            if tuple(flags.shape) != (b,):
                raise ValueError(
                    f"MultimodalEncoder: present[{name!r}] has shape {tuple(flags.shape)}; expected ({b},)"
                )
        blanked = {k: self._blank(obs[k], present.get(k)) for k in g.modalities if k in obs}
        device = next(self.parameters()).device
        # Which modality reaches the fusion for which sample: in obs, not masked by the caller, not dropped.
        avail = [
            (
                present[n].to(dtype=torch.bool, device=device)
                if n in present
                else torch.ones(b, dtype=torch.bool, device=device)
            )
            if n in blanked
            else torch.zeros(b, dtype=torch.bool, device=device)
            for n in g.modalities
        ]
        keep = torch.stack(avail, dim=1)  # (B, n_modalities)
        if self.training and c.modality_dropout > 0:
            keep = drop_modalities(keep, c.modality_dropout)
        encoded: dict[str, tuple[Tensor, Tensor]] = {}
        film = None  # (B, 2C) FiLM of the rgb features; zero (identity) where the instruction is masked or dropped
        if "instruction" in blanked:  # first: its FiLM of the image features (instruction_film) needs it
            tokens, mask = self._encode("instruction", blanked["instruction"])
            if self.training and c.instruction_token_dropout > 0:
                mask = drop_modalities(mask, c.instruction_token_dropout)
            encoded["instruction"] = tokens, mask
            if self.film is not None:
                i = g.modalities.index("instruction")
                film = self._from_instruction(self.film, tokens, mask & keep[:, i, None].to(mask.device))
        encoded |= {
            k: self._encode(k, v, film if k == "rgb" else None) for k, v in blanked.items() if k != "instruction"
        }
        ref = next(iter(encoded.values()))[0]
        parts = []
        for name in g.modalities:
            if name in encoded:
                tokens, mask = encoded[name]
            else:
                tokens = ref.new_zeros(b, self.n_tokens[name], c.dim)
                mask = torch.zeros(b, self.n_tokens[name], dtype=torch.bool, device=ref.device)
            parts.append((tokens.to(ref.dtype), mask))
        parts = [(t, m & keep[:, i, None].to(m.device)) for i, (t, m) in enumerate(parts)]
        if isinstance(self.fusion, PerceiverFusion):
            # The instruction's mask in parts already includes keep.
            query = (
                self._from_instruction(self.text_query, *parts[g.modalities.index("instruction")])
                if hasattr(self, "text_query")
                else None
            )
            tokens, pooled = self.fusion(
                torch.cat([t for t, _ in parts], 1), torch.cat([m for _, m in parts], 1), query
            )
        else:
            tokens, pooled = self.fusion(parts)
        if self.skip is not None:
            skip = self._proprio_skip(blanked, keep, pooled)
            tokens, pooled = tokens + skip[:, None].to(tokens.dtype), pooled + skip.to(pooled.dtype)
        return EncoderOutput(
            tokens=tokens,
            mask=torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device),
            pooled=pooled,
            present={name: parts[i][1].any(dim=1) for i, name in enumerate(g.modalities)},
        )

    @torch.no_grad()
    def instruction_views(self, instructions: Sequence[str]) -> dict[str, Tensor]:
        """For analysis (no dropout): how this encoder reads B instructions, each view (B, *) float32:
        ``text`` the mean of the text encoder's raw token states (for MiniLM, its sentence embedding), ``tokens`` the
        mean of the projected instruction tokens the fusion receives, and with instruction_film ``film`` (B, 2C), the
        FiLM applied to the image features. Comparing views of paraphrases tells where a sentence lands for the policy.
        """
        if self.text_encoder is None:
            raise ValueError("MultimodalEncoder.instruction_views: this encoder has no instruction modality")
        tokens, mask = self._encode("instruction", instructions)
        m = mask[..., None].float()
        views = {"tokens": (tokens.float() * m).sum(1) / m.sum(1).clamp_min(1)}
        if hasattr(self.text_encoder, "hidden_states"):  # LanguageEncoder (a stand-in in tests may lack it)
            hidden, hidden_mask = self.text_encoder.hidden_states(list(instructions))
            hm = hidden_mask[..., None].float()
            views["text"] = (hidden.float() * hm).sum(1) / hm.sum(1).clamp_min(1)
        if self.film is not None:
            views["film"] = self._from_instruction(self.film, tokens, mask).float()
        return views
