"""A distilled student of a diffusion policy: one (or two) network calls map noise to a chunk, keeping the modes.

The student is a denoiser-shaped network f(x_t, t, cond) -> clean chunk, trained to land where the teacher's
deterministic DDIM chain lands from the same point of that chain (Luhman & Luhman 2021 for the start of the
chain; every point of it as a consistency model's function, Song et al. 2023):

    teacher chain from z:  x_{t_0} = z  ->  x_{t_1}  ->  ...  ->  x_{t_{S-1}}  ->  chunk*(z)   (t_0 = T - 1)
    student loss:          || f(x_{t_k}, t_k, cond) - chunk*(z) ||²   for k drawn from 0..S-1

Because it maps each noise to the teacher's chunk for that noise, it does not regress the mean of the modes: the
noise space stays split between routes as the teacher splits it. Sampling (``steps``):

    1 step   chunk = f(z, t_0)
    2 steps  chunk = f(sqrt(ᾱ_m) f(z, t_0) + sqrt(1 - ᾱ_m) ε, t_m),  t_m = t_{S // 2}  (consistency-model sampling)

The student starts as a copy of its teacher (normaliser, encoder and, where the shapes match, the denoiser), so it
starts where the teacher's one-step DDIM is. Training needs the teacher (``attach_teacher``, done by
``dmrl distill`` / ``--algo.type distill``); acting, saving and loading need only the student.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import yaml
from torch import Tensor, nn

from dmrl.data import Normalizer
from dmrl.diffusion import SCHEDULE_KINDS, TIMESTEP_SPACINGS, DDIMSampler, make_schedule
from dmrl.models import DENOISERS, build_denoiser
from dmrl.policies.base import ChunkConfig, ChunkPolicy
from dmrl.policies.diffusion import DiffusionPolicy
from dmrl.policies.observations import ObsDim


@dataclass
class StudentPolicyConfig:
    """The student's network and the teacher's DDIM grid it was distilled on (``dmrl distill`` copies the grid and,
    by default, the denoiser settings from the teacher)."""

    steps: int = 1
    """Network calls per chunk: 1, or 2 (re-noise the first chunk to the grid's middle step, denoise again)."""
    denoiser: str = "mlp"
    """mlp, unet or transformer (the teacher's kind, to start from its weights)."""
    denoiser_kwargs: dict = field(default_factory=dict)
    """e.g. hidden_dim 512 n_blocks 4 (the teacher's, to start from its weights)."""
    schedule: str = "cosine"
    """The teacher's noise schedule: cosine, linear."""
    num_train_steps: int = 100
    """The teacher's T."""
    teacher_steps: int = 10
    """The teacher's DDIM steps S: the grid t_0 .. t_{S-1} the student was trained on."""
    timestep_spacing: str = "trailing"
    """The teacher's DDIM spacing: trailing or leading."""

    def __post_init__(self) -> None:
        self.denoiser_kwargs = {
            k: yaml.safe_load(v) if isinstance(v, str) else v for k, v in dict(self.denoiser_kwargs).items()
        }
        if self.steps not in (1, 2):
            raise ValueError(f"student steps: got {self.steps!r}; allowed 1 or 2")
        if self.denoiser not in DENOISERS:
            raise ValueError(f"student denoiser: got {self.denoiser!r}; allowed: {', '.join(DENOISERS)}")
        if self.schedule not in SCHEDULE_KINDS or self.timestep_spacing not in TIMESTEP_SPACINGS:
            raise ValueError(
                f"student schedule / timestep_spacing: got {self.schedule!r} / {self.timestep_spacing!r}; allowed "
                f"{', '.join(SCHEDULE_KINDS)} / {', '.join(TIMESTEP_SPACINGS)}"
            )
        if not 1 <= self.teacher_steps <= self.num_train_steps:
            raise ValueError(
                f"student teacher_steps: got {self.teacher_steps}; allowed 1..num_train_steps={self.num_train_steps}"
            )
        if self.steps == 2 and self.teacher_steps < 2:
            raise ValueError("student steps 2 re-noises to the middle of the teacher's grid: needs teacher_steps >= 2")


PSEUDO_HUBER_C = 0.00054
"""The pseudo-Huber loss's c (Song & Dhariwal 2023's 0.00054·sqrt(d) for the norm, here on the RMS error)."""


def _repeat(cond: tuple[Tensor, Tensor | None], rows: int) -> tuple[Tensor, Tensor | None]:
    """A condition (B, ...), mask or None -> ``rows`` rows, each observation's copies adjacent."""
    r = rows // cond[0].shape[0]
    return cond if r == 1 else tuple(None if c is None else c.repeat_interleave(r, 0) for c in cond)


def _same_tensors(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k].to(a[k].device)) for k in a)


class _Detached:
    """Holds the teacher outside the student's modules: not saved, not moved by .to(), shared by deep copies (the
    EMA copy of the student needs no teacher of its own)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __deepcopy__(self, memo: dict) -> _Detached:
        return self


class StudentPolicy(ChunkPolicy):
    name = "student"

    def __init__(
        self,
        chunk: ChunkConfig,
        config: StudentPolicyConfig,
        obs_dims: Mapping[str, ObsDim],
        action_dim: int,
        normalizer: Normalizer | None = None,
        text_encoder: nn.Module | None = None,
    ):
        self.config = config
        super().__init__(chunk, obs_dims, action_dim, normalizer, text_encoder)
        self.denoiser = build_denoiser(
            config.denoiser,
            action_dim=action_dim,
            horizon=chunk.horizon,
            cond_dim=self.encoder.out_dim,
            out_mult=1,
            **config.denoiser_kwargs,
        )
        schedule = make_schedule(config.schedule, num_train_steps=config.num_train_steps)
        grid = DDIMSampler(
            schedule, num_steps=config.teacher_steps, timestep_spacing=config.timestep_spacing
        ).timesteps  # (S,) long, t_0 = the noisiest
        # Tables, not weights: rebuilt from the config, moved with the module.
        self.register_buffer("grid", grid, persistent=False)
        self.register_buffer("grid_sqrt_ab", schedule.sqrt_alphas_cumprod[grid].float(), persistent=False)
        self.register_buffer("grid_sqrt_1m_ab", schedule.sqrt_one_minus_alphas_cumprod[grid].float(), persistent=False)
        self._teacher: _Detached | None = None
        self._encoder_frozen = False  # set by freeze_encoder: no gradients, and eval mode (no modality dropout)
        self._shares_encoder = False  # frozen and equal to the teacher's: one encoding serves both
        self.register_load_state_dict_post_hook(self._check_shared)
        self.start_fraction = 0.5  # share of a batch trained from the chain's start (set by --algo.start-fraction)
        self.distance = "l2"  # l2 or pseudo_huber (set by --algo.distance)
        self.noise_samples = 1  # noises (teacher chains) per observation (set by --algo.noise-samples)

    @property
    def starts(self) -> tuple[int, ...]:
        """Grid indices the sampler denoises from: (0,) or (0, S // 2)."""
        return (0,) if self.config.steps == 1 else (0, self.config.teacher_steps // 2)

    # ------------------------------------------------------------------ teacher
    def copy_teacher(self, teacher: DiffusionPolicy) -> list[str]:
        """Start from the teacher: normaliser and encoder weights, and the denoiser's where names and shapes match.
        Returns the denoiser tensors that could not be copied (another size, or a hybrid teacher's output layer)."""
        self.check_teacher(teacher)
        self.normalizer.load_state_dict(teacher.normalizer.state_dict())
        self.encoder.load_state_dict(teacher.encoder.state_dict())
        mine, theirs = self.denoiser.state_dict(), teacher.denoiser.state_dict()
        same = {k: v for k, v in theirs.items() if k in mine and mine[k].shape == v.shape}
        self.denoiser.load_state_dict(same, strict=False)
        self._check_shared()
        return sorted(set(mine) - set(same))

    def check_teacher(self, teacher: nn.Module) -> None:
        """A one-line error unless ``teacher`` is a diffusion policy on the same observations, actions and grid."""
        if not isinstance(teacher, DiffusionPolicy):
            raise ValueError(
                f"student: the teacher must be a diffusion policy; got {getattr(teacher, 'name', teacher)}"
            )
        if (teacher.chunk, dict(teacher.obs_dims), teacher.action_dim) != (
            self.chunk,
            dict(self.obs_dims),
            self.action_dim,
        ):
            raise ValueError(
                "student: the teacher's chunk settings, observations or action dim differ from the student's; "
                "distill with `dmrl distill --teacher CHECKPOINT`, which copies them"
            )
        t = teacher.config
        mine = (self.config.schedule, self.config.num_train_steps, self.config.teacher_steps)
        theirs = (t.schedule, t.num_train_steps, teacher.sampler.num_steps)
        if mine != theirs or not torch.equal(teacher.sampler.timesteps.cpu(), self.grid.cpu()):
            raise ValueError(
                f"student: schedule / T / S {mine} differ from the teacher's {theirs} (or its DDIM spacing); "
                "distill with `dmrl distill --teacher CHECKPOINT`, which copies them"
            )

    def attach_teacher(self, teacher: DiffusionPolicy) -> None:
        """Train against ``teacher`` (frozen, deterministic DDIM on its own grid); it is not saved with the student."""
        self.check_teacher(teacher)
        teacher.set_sampler(teacher.sampler.num_steps, eta=0.0)
        self._teacher = _Detached(teacher.eval().requires_grad_(False))
        self._check_shared()

    def freeze_encoder(self) -> None:
        """Keep the encoder as it is while the denoiser trains: no gradients, and eval mode whatever ``train()``
        sets (a frozen encoder's modality and word dropout would only corrupt the condition the teacher labels).
        When it then equals the attached teacher's (normaliser included), the teacher's chain reuses its encoding:
        a multimodal encoder is most of a distillation step's cost. An auxiliary head (chunk.aux_state) freezes
        too: it shapes a trained encoder and changes nothing a frozen one's student does."""
        self.encoder.requires_grad_(False)
        if self.aux_head is not None:  # no loss reaches it: a trainable one would stall DDP's gradient reduction
            self.aux_head.requires_grad_(False)
        self._encoder_frozen = True
        self.encoder.eval()
        self._check_shared()

    def _check_shared(self, *_: object) -> None:
        """Decide whether the teacher's chain may reuse the student's encoding (after freezing, attaching a teacher
        and loading weights: a resumed state or another teacher could make them differ)."""
        teacher = self._teacher.module if self._teacher is not None else None
        self._shares_encoder = (
            self._encoder_frozen
            and teacher is not None
            and teacher.config.denoiser == self.config.denoiser  # which of the encoding each reads (tokens or pooled)
            and all(
                _same_tensors(mine.state_dict(), theirs.state_dict())
                for mine, theirs in ((self.encoder, teacher.encoder), (self.normalizer, teacher.normalizer))
            )
        )

    def train(self, mode: bool = True) -> StudentPolicy:
        super().train(mode)
        if self._encoder_frozen:
            self.encoder.eval()
        return self

    @torch.no_grad()
    def teacher_chain(
        self, obs: Mapping[str, Tensor | list[str]], z: Tensor, cond: tuple[Tensor, Tensor | None] | None = None
    ) -> tuple[Tensor, Tensor]:
        """The teacher's DDIM chain from z (B·R, Tp, Da), R noises per observation in adjacent rows: (points
        x_{t_k} (S, B·R, Tp, Da), its chunk (B·R, Tp, Da)); ``cond``: the condition already computed (and
        repeated) by an encoder equal to the teacher's (else it encodes ``obs``)."""
        if self._teacher is None:
            raise ValueError("student: no teacher attached; train a student with `dmrl distill --teacher CHECKPOINT`")
        teacher = self._teacher.module
        if next(teacher.parameters()).device != z.device:
            teacher.to(z.device)
        if cond is None:
            cond = _repeat(teacher.condition(obs), z.shape[0])
        denoise = teacher.denoise_fn(*cond)
        points: list[Tensor] = []

        def record(x: Tensor, t: Tensor) -> Tensor:
            points.append(x)
            return denoise(x, t)

        chunk = teacher.sampler.sample(record, z.shape, init_noise=z)
        return torch.stack(points), chunk

    # ------------------------------------------------------------------ training side
    def loss(self, batch: dict) -> dict[str, Tensor]:
        """Distillation: each item's noise goes down the teacher's chain, and the student predicts the chain's end
        from one point of it (the start, k = 0, for ``start_fraction`` of the items: the one-step case; any k for
        the rest)."""
        obs = batch["obs"]
        b = batch["action"].shape[0] * self.noise_samples
        z = torch.randn(b, self.chunk.horizon, self.action_dim, device=batch["action"].device)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self._encoder_frozen):
            enc = self.encode_tokens(obs)
        cond = _repeat(self._condition_from(enc), b)  # each observation's R noises in adjacent rows
        # (S, B·R, Tp, Da), (B·R, Tp, Da)
        points, target = self.teacher_chain(obs, z, cond if self._shares_encoder else None)
        s = points.shape[0]
        k = torch.randint(0, s, (b,), device=z.device)
        k = torch.where(torch.rand(b, device=z.device) < self.start_fraction, torch.zeros_like(k), k)
        x = points[k, torch.arange(b, device=z.device)]
        pred = self.denoiser(x, self.grid[k], *cond).float()
        err = (pred - target.float()).pow(2).mean(dim=(1, 2))  # (B·R,)
        # pseudo_huber: about the error's norm, whose minimiser over targets the student cannot tell apart is their
        # geometric median (the majority route), where the squared error's is their mean (into the obstacle).
        per_item = err if self.distance == "l2" else (err + PSEUDO_HUBER_C**2).sqrt() - PSEUDO_HUBER_C
        first = k == 0
        out = {"loss": per_item.mean(), "distill_mse": err.mean()}
        out["distill_first"] = err[first].mean() if first.any() else err.new_zeros(())
        # An auxiliary head shapes a trained encoder; on a frozen one it would change nothing the student does.
        return out if self._encoder_frozen else self._add_aux(out, batch, enc.pooled)

    # The diffusion policy's: the transformer denoiser reads the multimodal tokens, the others the pooled vector.
    condition = DiffusionPolicy.condition
    _condition_from = DiffusionPolicy._condition_from

    # ------------------------------------------------------------------ sampling
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
        """cond (B, D) or (B, K, D), cond_mask (B, K) or None -> normalised chunk (B, Tp, Da) in ``steps`` calls.

        Noise: ``init_noise`` z (B, Tp, Da) and, for 2 steps, ``step_noise`` (1, B, Tp, Da) (the re-noising draw);
        otherwise drawn from ``generator`` (None: torch's global RNG), z first. ``grad_steps``: how many of the
        last calls carry gradients (0..steps).
        """
        n = len(self.starts)
        if not 0 <= grad_steps <= n:
            raise ValueError(f"sample_chunk grad_steps: got {grad_steps}; allowed 0..{n} (the student's steps)")
        shape = (cond.shape[0], self.chunk.horizon, self.action_dim)
        if init_noise is None:
            gen_device = generator.device if generator is not None else cond.device
            init_noise = torch.randn(shape, generator=generator, device=gen_device, dtype=torch.float32)
        x = init_noise.to(cond.device, torch.float32)
        chunk = x
        for j, i in enumerate(self.starts):
            if j > 0:  # re-noise the chunk so far to grid step i (a Python int: the loop stays static for export)
                if step_noise is not None:
                    eps = step_noise[j - 1].to(cond.device)
                else:
                    gen_device = generator.device if generator is not None else cond.device
                    eps = torch.randn(shape, generator=generator, device=gen_device).to(cond.device)
                x = self.grid_sqrt_ab[i] * chunk + self.grid_sqrt_1m_ab[i] * eps
            with torch.set_grad_enabled(torch.is_grad_enabled() and j >= n - grad_steps):
                t = self.grid[i].expand(shape[0])
                chunk = self.denoiser(x, t, cond, cond_mask).clamp(-1.0, 1.0)
        return chunk
