"""Contract tests build every registered policy; a distilled student trains only against a teacher, so these
helpers give it a fresh diffusion teacher of its own shape and grid."""

from __future__ import annotations

import torch

from dmrl.policies import ChunkPolicy, DiffusionPolicy, DiffusionPolicyConfig, StudentPolicyConfig


def student_config(**denoiser_kwargs) -> StudentPolicyConfig:
    """A small student on a T = 10, S = 2 grid."""
    return StudentPolicyConfig(denoiser_kwargs=denoiser_kwargs, num_train_steps=10, teacher_steps=2)


def with_teacher(policy: ChunkPolicy) -> ChunkPolicy:
    """``policy``, with a randomly initialised diffusion teacher attached when it is a student."""
    if policy.name != "student":
        return policy
    c = policy.config
    cfg = DiffusionPolicyConfig(
        denoiser=c.denoiser,
        denoiser_kwargs=c.denoiser_kwargs,
        schedule=c.schedule,
        num_train_steps=c.num_train_steps,
        num_inference_steps=c.teacher_steps,
        timestep_spacing=c.timestep_spacing,
    )
    text = getattr(policy.encoder, "text_encoder", None)
    teacher = DiffusionPolicy(policy.chunk, cfg, policy.obs_dims, policy.action_dim, None, text_encoder=text)
    with torch.no_grad():  # its output layer starts at zero, as the student's: a target of 0 would teach nothing
        for p in teacher.denoiser.parameters():
            p.add_(0.1 * torch.randn_like(p))
    # The teacher shares the student's LanguageEncoder (a module-scoped fixture, too slow to build twice), and
    # attach_teacher freezes the teacher: give its trainable projection back to the student and later tests.
    trainable = [p for p in text.parameters() if p.requires_grad] if text is not None else []
    policy.attach_teacher(teacher)
    for p in trainable:
        p.requires_grad_(True)
    return policy
