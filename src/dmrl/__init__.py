"""dmrl: reinforcement learning with diffusion-model policies over multimodal observations."""

from dmrl.envs import _gl as _gl  # picks a headless MUJOCO_GL before anything imports mujoco

__version__ = "0.1.0"
