"""dmrl: reinforcement learning with diffusion-model policies over multimodal observations."""

__version__ = "0.1.0"
