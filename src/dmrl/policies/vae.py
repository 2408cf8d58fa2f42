"""Conditional VAE over action chunks (ACT-like, Zhao et al. 2023): q(z|s,a), p(a|s,z), KL weight beta."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dmrl.data import Normalizer
from dmrl.policies.base import ChunkConfig, ChunkPolicy
from dmrl.policies.mlp_heads import ResidualMLP, check_one_step, masked_mean
from dmrl.policies.observations import ObsDim

TEST_Z = ("sample", "zero")


@dataclass
class VAEPolicyConfig:
    """Latent-variable chunk policy; at test time z ~ N(0, I) ("sample") or z = 0 ("zero", ACT's choice)."""

    latent_dim: int = 16
    """Dimension of z."""
    hidden: int = 512
    """Width of the residual MLPs."""
    depth: int = 3
    """Residual blocks per MLP."""
    beta: float = 0.05
    """KL weight against the reconstruction error."""
    test_z: str = "sample"
    """z at test time: sample (z ~ N(0, I)) or zero."""

    def __post_init__(self) -> None:
        if self.test_z not in TEST_Z:
            raise ValueError(f"vae test_z: got {self.test_z!r}; allowed: {', '.join(TEST_Z)}")
        if self.latent_dim < 1 or self.beta < 0 or self.hidden < 8 or self.depth < 1:
            raise ValueError("vae policy: need latent_dim >= 1, beta >= 0, hidden >= 8, depth >= 1")


class VAEPolicy(ChunkPolicy):
    name = "vae"

    def __init__(
        self,
        chunk: ChunkConfig,
        config: VAEPolicyConfig,
        obs_dims: Mapping[str, ObsDim],
        action_dim: int,
        normalizer: Normalizer | None = None,
        text_encoder: nn.Module | None = None,
    ):
        self.config = config
        super().__init__(chunk, obs_dims, action_dim, normalizer, text_encoder)
        d, flat = self.encoder.out_dim, chunk.horizon * action_dim
        self.flat = flat
        self.posterior = ResidualMLP(d + flat, 2 * config.latent_dim, config.hidden, config.depth)
        self.decoder = ResidualMLP(d + config.latent_dim, flat, config.hidden, config.depth)

    def loss(self, batch: dict) -> dict[str, Tensor]:
        target = self.normalizer.normalize("actions", batch["action"].float())  # (B, Tp, Da)
        cond = self.encode(batch["obs"])
        stats = self.posterior(torch.cat([cond, target.flatten(1)], dim=-1))
        mu, logvar = stats.float().chunk(2, dim=-1)  # fp32 loss under autocast
        logvar = logvar.clamp(-10.0, 10.0)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        recon = self.decoder(torch.cat([cond, z], dim=-1)).reshape(target.shape).float()
        rec = masked_mean(((recon - target) ** 2).mean(-1), batch.get("action_mask"))
        kl = 0.5 * (mu**2 + logvar.exp() - 1.0 - logvar).sum(-1).mean()
        out = {"loss": rec + self.config.beta * kl, "recon": rec.detach(), "kl": kl.detach()}
        return self._add_aux(out, batch, cond)

    def sample_chunk(
        self,
        cond: Tensor,
        cond_mask: Tensor | None = None,
        grad_steps: int = 0,
        *,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """cond (B, D) -> decoded chunk (B, Tp, Da), normalised, from z ~ N(0, I) (test_z sample, drawn from
        ``generator``, None: torch's global RNG) or z = 0; one step, so ``grad_steps`` 1 carries gradients and 0
        does not. cond_mask is unused (the pooled condition has none)."""
        check_one_step(grad_steps)
        z = torch.zeros(cond.shape[0], self.config.latent_dim, device=cond.device)
        if self.config.test_z == "sample":
            # Drawn where the generator lives (a CPU generator gives the same z on any device), as the diffusion
            # sampler draws its noise.
            gen_device = generator.device if generator is not None else z.device
            z = torch.randn(z.shape, generator=generator, device=gen_device, dtype=z.dtype).to(z.device)
        with torch.set_grad_enabled(torch.is_grad_enabled() and grad_steps > 0):
            out = self.decoder(torch.cat([cond, z], dim=-1))
        return out.reshape(cond.shape[0], self.chunk.horizon, self.action_dim)
