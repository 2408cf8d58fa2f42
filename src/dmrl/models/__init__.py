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
from dmrl.models.depth import DepthConfig, DepthEncoder
from dmrl.models.fusion import ConcatFusion, PerceiverConfig, PerceiverFusion
from dmrl.models.language import LanguageConfig, LanguageEncoder  # cheap: transformers loads on first build
from dmrl.models.multimodal import (
    EncoderOutput,
    MultimodalEncoder,
    MultimodalEncoderConfig,
    MultimodalExperimental,
    MultimodalGeometry,
)
from dmrl.models.resnet import ResNet18GN, ResNetGNConfig
from dmrl.models.tokens import FrameTokenizer, ProprioTokenizer
from dmrl.models.vit import ViTConfig, ViTEncoder

__all__ = [
    "DENOISERS",
    "ConcatFusion",
    "Denoiser",
    "DenoiserConfig",
    "DepthConfig",
    "DepthEncoder",
    "EncoderOutput",
    "FrameTokenizer",
    "LanguageConfig",
    "LanguageEncoder",
    "MLPDenoiser",
    "MLPDenoiserConfig",
    "MultimodalEncoder",
    "MultimodalEncoderConfig",
    "MultimodalExperimental",
    "MultimodalGeometry",
    "PerceiverConfig",
    "PerceiverFusion",
    "ProprioTokenizer",
    "ResNet18GN",
    "ResNetGNConfig",
    "TransformerDenoiser",
    "TransformerDenoiserConfig",
    "UNet1DDenoiser",
    "UNet1DDenoiserConfig",
    "ViTConfig",
    "ViTEncoder",
    "build_denoiser",
]
