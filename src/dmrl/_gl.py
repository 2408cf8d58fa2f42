"""Choose a headless OpenGL backend for MuJoCo before mujoco is imported (EGL, else OSMesa)."""

from __future__ import annotations

import ctypes.util
import os


def select_gl_backend() -> str | None:
    """Set ``MUJOCO_GL`` to ``egl`` if libEGL is present, else ``osmesa`` if libOSMesa is; keep a user's choice.

    Must run before the first ``import mujoco``: MuJoCo reads the variable once, at import. Returns the
    backend chosen (or already set), or None when neither library exists (rendering then fails with the
    one-line hint from :func:`render_hint`).
    """
    if os.environ.get("MUJOCO_GL"):
        return os.environ["MUJOCO_GL"]
    for backend, lib in (("egl", "EGL"), ("osmesa", "OSMesa")):
        if ctypes.util.find_library(lib):
            os.environ["MUJOCO_GL"] = backend
            # PyOpenGL must agree with MuJoCo, or it loads a GLX platform that needs a display.
            os.environ.setdefault("PYOPENGL_PLATFORM", backend)
            return backend
    return None


def render_hint() -> str:
    return (
        f"offscreen rendering failed (MUJOCO_GL={os.environ.get('MUJOCO_GL', 'unset')}); install libegl1 "
        "or libosmesa6 (apt-get install -y libegl1 libosmesa6), set MUJOCO_GL=egl|osmesa, and import dmrl "
        "before mujoco (MuJoCo reads MUJOCO_GL once, at import)"
    )


BACKEND = select_gl_backend()
