"""Networks: modality encoders, fusion, denoisers and critics (see DESIGN.md, models/)."""

from dmrl.models.denoisers import (
    DENOISERS,
    Denoiser,
    DenoiserConfig,
    MLPDenoiser,
    MLPDenoiserConfig,
    TransformerDenoiser,
    TransformerDenoiserConfig,
    UNet1DDenoiser,
    UNet1DDenoiserConfig,
    build_denoiser,
)
from dmrl.models.language import LanguageConfig, LanguageEncoder  # cheap: transformers loads on first build

__all__ = [
    "DENOISERS",
    "Denoiser",
    "DenoiserConfig",
    "LanguageConfig",
    "LanguageEncoder",
    "MLPDenoiser",
    "MLPDenoiserConfig",
    "TransformerDenoiser",
    "TransformerDenoiserConfig",
    "UNet1DDenoiser",
    "UNet1DDenoiserConfig",
    "build_denoiser",
]
