"""dmrl: reinforcement learning with diffusion-model policies over multimodal observations."""

# First import of the package: choose a headless MUJOCO_GL before any submodule imports mujoco.
from dmrl import _gl as _gl  # noqa: I001

# Register the environments with gymnasium, as gymnasium packages do (entry-point strings: no MuJoCo, no torch).
from dmrl.envs import registry as _registry  # noqa: F401

__version__ = "0.1.0"
