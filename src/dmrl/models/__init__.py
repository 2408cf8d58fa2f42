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

__all__ = [
    "DENOISERS",
    "Denoiser",
    "DenoiserConfig",
    "MLPDenoiser",
    "MLPDenoiserConfig",
    "TransformerDenoiser",
    "TransformerDenoiserConfig",
    "UNet1DDenoiser",
    "UNet1DDenoiserConfig",
    "build_denoiser",
]
