"""Diffusion math for action chunks (DDPM / DDIM): schedules, prediction types, losses, samplers — pure tensors."""

from dmrl.diffusion.losses import (
    HYBRID_WEIGHT_KINDS,
    HybridWeights,
    diffusion_loss,
    masked_mse,
    sample_training_inputs,
)
from dmrl.diffusion.prediction import (
    PRED_TYPES,
    check_pred_type,
    output_dim,
    prediction_target,
    split_prediction,
    split_with_coefficients,
    velocity,
)
from dmrl.diffusion.samplers import TIMESTEP_SPACINGS, VARIANCE_TYPES, DDIMSampler, DDPMSampler, DenoiseFn
from dmrl.diffusion.schedule import SCHEDULE_KINDS, NoiseSchedule, extract, make_schedule, q_sample

__all__ = [
    "DDIMSampler",
    "DDPMSampler",
    "DenoiseFn",
    "HYBRID_WEIGHT_KINDS",
    "HybridWeights",
    "NoiseSchedule",
    "PRED_TYPES",
    "SCHEDULE_KINDS",
    "TIMESTEP_SPACINGS",
    "VARIANCE_TYPES",
    "check_pred_type",
    "diffusion_loss",
    "extract",
    "make_schedule",
    "masked_mse",
    "output_dim",
    "prediction_target",
    "q_sample",
    "sample_training_inputs",
    "split_prediction",
    "split_with_coefficients",
    "velocity",
]
