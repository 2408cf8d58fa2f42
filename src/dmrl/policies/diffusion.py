"""Diffusion policy (Chi et al. 2023): DDPM-trained denoiser over action chunks, DDIM sampling at test time.

Prediction types epsilon, sample (x0), v and hybrid (both heads, trained with the x0 loss weighted early and the
ε loss late, see :class:`dmrl.diffusion.HybridWeights`); the denoiser and the sampler come from
:mod:`dmrl.models.denoisers` and :mod:`dmrl.diffusion`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import yaml
from torch import Tensor, nn

from dmrl.data import Normalizer
from dmrl.diffusion import (
    PRED_TYPES,
    SCHEDULE_KINDS,
    TIMESTEP_SPACINGS,
    DDIMSampler,
    HybridWeights,
    diffusion_loss,
    make_schedule,
    output_dim,
    sample_training_inputs,
)
from dmrl.models import DENOISERS, build_denoiser
from dmrl.models.multimodal import EncoderOutput
from dmrl.policies.base import ChunkConfig, ChunkPolicy
from dmrl.policies.observations import ObsDim

SAMPLE_HEADS = ("both", "eps", "x0", "blend")


@dataclass
class DiffusionPolicyConfig:
    """Denoiser, noise schedule, prediction type and DDIM sampler of a :class:`DiffusionPolicy`."""

    denoiser: str = "mlp"
    """mlp, unet or transformer."""
    denoiser_kwargs: dict = field(default_factory=dict)
    """e.g. hidden_dim 512 n_blocks 3 (mlp)."""
    prediction_type: str = "sample"
    """epsilon, sample (x0), v, hybrid."""
    schedule: str = "cosine"
    """Noise schedule: cosine, linear."""
    num_train_steps: int = 100
    """T: diffusion steps in training."""
    num_inference_steps: int = 10
    """S: DDIM steps at inference (1..T)."""
    ddim_eta: float = 0.0
    """DDIM sampling noise η (0: deterministic, 1: DDPM-like)."""
    ddim_noise_scale: float = 1.0
    """Scale of that noise (0: each step's mean)."""
    timestep_spacing: str = "trailing"
    """trailing or leading DDIM steps."""
    hybrid: HybridWeights = field(default_factory=HybridWeights)
    """x0/ε loss weights over training (prediction_type hybrid)."""
    noise_samples: int = 1
    """Noise draws (t, ε) per observation."""
    sample_head: str = "both"
    """Hybrid heads: both/eps/x0/blend."""

    def __post_init__(self) -> None:
        # From the command line (--policy.denoiser-kwargs hidden_dim 128 down_dims "[64, 128]") every value
        # arrives as a string: read each as a YAML scalar / list, as a preset file would give it.
        self.denoiser_kwargs = {
            k: yaml.safe_load(v) if isinstance(v, str) else v for k, v in dict(self.denoiser_kwargs).items()
        }
        if self.denoiser not in DENOISERS:
            raise ValueError(f"diffusion denoiser: got {self.denoiser!r}; allowed: {', '.join(DENOISERS)}")
        if self.prediction_type not in PRED_TYPES:
            raise ValueError(
                f"diffusion prediction_type: got {self.prediction_type!r}; allowed: {', '.join(PRED_TYPES)}"
            )
        if not 1 <= self.num_inference_steps <= self.num_train_steps:
            raise ValueError(
                f"diffusion num_inference_steps: got {self.num_inference_steps}; "
                f"allowed 1..num_train_steps={self.num_train_steps}"
            )
        if not isinstance(self.noise_samples, int) or self.noise_samples < 1:
            raise ValueError(f"diffusion noise_samples: got {self.noise_samples!r}; allowed an integer >= 1")
        if self.schedule not in SCHEDULE_KINDS:
            raise ValueError(f"diffusion schedule: got {self.schedule!r}; allowed: {', '.join(SCHEDULE_KINDS)}")
        if self.timestep_spacing not in TIMESTEP_SPACINGS or self.ddim_eta < 0 or self.ddim_noise_scale < 0:
            raise ValueError(
                f"diffusion timestep_spacing / ddim_eta / ddim_noise_scale: got {self.timestep_spacing!r} / "
                f"{self.ddim_eta} / {self.ddim_noise_scale}; allowed: {', '.join(TIMESTEP_SPACINGS)} / >= 0 / >= 0"
            )
        if self.sample_head not in SAMPLE_HEADS:
            raise ValueError(f"diffusion sample_head: got {self.sample_head!r}; allowed: {', '.join(SAMPLE_HEADS)}")
        if self.sample_head != "both" and self.prediction_type != "hybrid":
            raise ValueError("diffusion sample_head eps/x0 needs prediction_type hybrid (two heads to choose from)")
        if isinstance(self.hybrid, dict):
            self.hybrid = HybridWeights(**self.hybrid)


class DiffusionPolicy(ChunkPolicy):
    name = "diffusion"

    def __init__(
        self,
        chunk: ChunkConfig,
        config: DiffusionPolicyConfig,
        obs_dims: Mapping[str, ObsDim],
        action_dim: int,
        normalizer: Normalizer | None = None,
        text_encoder: nn.Module | None = None,
    ):
        self.config = config
        super().__init__(chunk, obs_dims, action_dim, normalizer, text_encoder)
        out_mult = output_dim(config.prediction_type, action_dim) // action_dim
        self.denoiser = build_denoiser(
            config.denoiser,
            action_dim=action_dim,
            horizon=chunk.horizon,
            cond_dim=self.encoder.out_dim,
            out_mult=out_mult,
            **config.denoiser_kwargs,
        )
        self.schedule = make_schedule(config.schedule, num_train_steps=config.num_train_steps)
        self.set_sampler(config.num_inference_steps, config.ddim_eta)

    def set_sampler(self, num_steps: int, eta: float | None = None, head: str | None = None) -> None:
        """Switch the DDIM step count, eta and (hybrid) sampling head used by ``act`` / ``predict_chunk``."""
        head = head or self.config.sample_head
        if head not in SAMPLE_HEADS or (head != "both" and self.config.prediction_type != "hybrid"):
            raise ValueError(f"sample head {head!r}: allowed {', '.join(SAMPLE_HEADS)} (eps/x0 for hybrid policies)")
        self._head = head
        pred_type = {"both": self.config.prediction_type, "eps": "epsilon", "x0": "sample", "blend": "epsilon"}[head]
        self.sampler = DDIMSampler(
            self.schedule,
            num_steps=num_steps,
            eta=self.config.ddim_eta if eta is None else eta,
            noise_scale=self.config.ddim_noise_scale if eta is None else 1.0,
            pred_type=pred_type,
            clip_sample=True,
            timestep_spacing=self.config.timestep_spacing,
        )

    def _apply(self, fn, recurse=True):
        # Keep the (non-module) schedule and sampler tables on the same device as the weights.
        out = super()._apply(fn, recurse)
        device = self.normalizer.actions_scale.device
        self.schedule = self.schedule.to(device)
        self.sampler = self.sampler.to(device)
        return out

    def loss(self, batch: dict) -> dict[str, Tensor]:
        x0 = self.normalizer.normalize("actions", batch["action"].float())  # (B, Tp, Da)
        enc = self.encode_tokens(batch["obs"])
        cond, cond_mask = self._condition_from(enc)  # (B, D), None or (B, K, D), (B, K)
        mask, weight = batch.get("action_mask"), batch.get("sample_weight")  # (B, Tp) bool, (B,): both optional
        k = self.config.noise_samples
        if k > 1:  # (B, ...) -> (B * k, ...), each observation's rows adjacent
            x0, cond = x0.repeat_interleave(k, 0), cond.repeat_interleave(k, 0)
            cond_mask, mask, weight = (
                None if v is None else v.repeat_interleave(k, 0) for v in (cond_mask, mask, weight)
            )
        t, noise, x_t = sample_training_inputs(self.schedule, x0)
        model_out = self.denoiser(x_t, t, cond, cond_mask).float()  # the loss in fp32 under autocast
        weights = None
        if self.config.prediction_type == "hybrid":
            weights = self.config.hybrid.weights(float(batch.get("progress", 0.0)))
        out = diffusion_loss(
            self.config.prediction_type,
            model_out,
            x0,
            noise,
            x_t,
            t,
            self.schedule,
            mask=mask,
            hybrid_weights=weights,
            sample_weight=weight,
        )
        return self._add_aux(out, batch, enc.pooled)

    def condition(self, obs: Mapping[str, Tensor | list[str]]) -> tuple[Tensor, Tensor | None]:
        """The transformer denoiser cross-attends to the multimodal tokens (B, K, D) + mask (B, K); the MLP and
        U-Net take the pooled (B, D) vector (they would mean-pool the tokens anyway), as does every denoiser under
        the lowdim encoder (its one vector)."""
        return self._condition_from(self.encode_tokens(obs))

    def _condition_from(self, enc: EncoderOutput) -> tuple[Tensor, Tensor | None]:
        if self.config.denoiser == "transformer" and self.chunk.encoder_type == "multimodal":
            return enc.tokens, enc.mask
        return enc.pooled, None

    def denoise_fn(self, cond: Tensor, cond_mask: Tensor | None = None) -> Callable[[Tensor, Tensor], Tensor]:
        """denoise_fn(x_t (B, Tp, Da), t (B,)) -> what the sampler reads, with the configured sampling head."""
        if self._head == "blend":
            return lambda x, t: self._blended_eps(x, t, cond, cond_mask)
        # A hybrid output is [eps head | x0 head] on the last dim; one head alone is a plain eps / x0 model.
        da = self.action_dim
        head = {"both": slice(None), "eps": slice(0, da), "x0": slice(da, 2 * da)}[self._head]
        return lambda x, t: self.denoiser(x, t, cond, cond_mask)[..., head]

    def sample_chunk(
        self,
        cond: Tensor,
        cond_mask: Tensor | None = None,
        grad_steps: int = 0,
        *,
        generator: torch.Generator | None = None,
        init_noise: Tensor | None = None,
        step_noise: Tensor | None = None,
    ) -> Tensor:
        """cond (B, D) or (B, K, D), cond_mask (B, K) bool or None -> normalised chunk (B, Tp, Da) by S DDIM steps.

        ``grad_steps`` k in 0..S: the last k denoiser calls carry gradients, the first S - k run under no_grad.
        k = 0 is plain sampling; k = S backpropagates through the whole chain (Diffusion-QL); 0 < k < S truncates
        backprop through the chain as truncated BPTT does through time, cheaper and with the same sample.
        Randomness as ``sampler.sample``: ``generator`` (None: torch's global RNG) in diffusers' order (init noise,
        then one draw per stochastic step), or passed in as init_noise (B, Tp, Da) / step_noise (S, B, Tp, Da);
        the same noise gives the same chunk for every k.
        """
        n = self.sampler.num_steps
        if not 0 <= grad_steps <= n:
            raise ValueError(f"sample_chunk grad_steps: got {grad_steps}; allowed 0..S={n} (S: DDIM steps)")
        shape = (cond.shape[0], self.chunk.horizon, self.action_dim)
        denoise = self.denoise_fn(cond, cond_mask)
        # 1. Start from pure noise x_T ~ N(0, I), drawn where the generator lives: a CPU generator then gives the
        #    same chunk on any device.
        if init_noise is None:
            gen_device = generator.device if generator is not None else cond.device
            init_noise = torch.randn(shape, generator=generator, device=gen_device, dtype=torch.float32)
        x = init_noise.to(cond.device, torch.float32)
        # The same (S, B) timestep view for every call: indexing it with the Python loop counter keeps the loop
        # static (no tensor-valued branches), so it traces and exports to ONNX as written.
        t_all = self.sampler.timesteps[:, None].expand(n, shape[0])
        for i in range(n):
            # 2. Gradients only through the last grad_steps steps, and only where the caller allows them; the loop
            #    index decides (a Python int), so the graph is the same every call.
            with torch.set_grad_enabled(torch.is_grad_enabled() and i >= n - grad_steps):
                # 3. Predict the noise / clean chunk at this noise level, conditioned on the observation.
                model_out = denoise(x, t_all[i])
                # 4. DDIM step x_t -> x_{t-1}; a stochastic sampler (eta > 0) adds fresh noise from the same stream.
                z = step_noise[i].to(cond.device) if step_noise is not None else None
                x = self.sampler.step(i, model_out, x, noise=z, generator=generator)
        return x

    def _blended_eps(self, x: Tensor, t: Tensor, cond: Tensor, cond_mask: Tensor | None = None) -> Tensor:
        """Noise estimate (B, Tp, Da) from the x0 head at high noise (t >= T/2) and the ε head below it."""
        da = self.action_dim
        out = self.denoiser(x, t, cond, cond_mask)
        eps_head, x0_head = out[..., :da], out[..., da:].clamp(-1.0, 1.0)
        s0 = self.schedule.sqrt_alphas_cumprod[t][:, None, None]
        s1 = self.schedule.sqrt_one_minus_alphas_cumprod[t][:, None, None]
        eps_from_x0 = (x - s0 * x0_head) / s1
        # torch.where, not a Python branch on t: the loop stays static for export.
        high = (t >= self.config.num_train_steps // 2)[:, None, None]
        return torch.where(high, eps_from_x0, eps_head)
