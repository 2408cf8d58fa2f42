"""Offscreen RGB and metric-depth rendering of several cameras in one pass each, shadows off by default.

On these CPU-only machines OpenGL is software (llvmpipe), so cost is dominated by vertex work: geometry is
tessellated coarsely (see scene.py ``<quality>``) and colour and depth are read back from the same draw,
instead of drawing the scene twice as ``mujoco.Renderer`` does for depth.
"""

from __future__ import annotations

import atexit
import weakref

import mujoco
import numpy as np

from dmrl import _gl

DEPTH_MAX = 2.0  # m; background (no geometry within the far plane) reads as this

_LIVE: weakref.WeakSet[MultiCameraRenderer] = weakref.WeakSet()


def _close_all() -> None:
    # Registered after MuJoCo's own atexit eglTerminate, so it runs first: contexts are freed while the
    # display is still valid, instead of failing noisily in __del__ at interpreter exit (mujoco 3.x).
    for renderer in list(_LIVE):
        renderer.close()


class MultiCameraRenderer:
    """Renders the named cameras into channel-stacked arrays: rgb uint8 (3V,H,W), depth float32 (V,H,W)."""

    def __init__(self, model: mujoco.MjModel, size: int, cameras: tuple[str, ...], shadows: bool = False):
        self.model = model
        self.size = size
        try:
            self._gl = mujoco.GLContext(size, size)
            self._make_current()
            self._ctx = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_50)
        except Exception as e:  # the GL backend fails in many library-specific ways; one clear line instead
            raise RuntimeError(f"{_gl.render_hint()} ({type(e).__name__}: {e})") from None
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._ctx)
        if not _LIVE:
            atexit.register(_close_all)
        _LIVE.add(self)
        self._scene = mujoco.MjvScene(model, maxgeom=200)
        self._opt = mujoco.MjvOption()
        self._pert = mujoco.MjvPerturb()
        self._cam = mujoco.MjvCamera()
        self._cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._rect = mujoco.MjrRect(0, 0, size, size)
        self._cam_ids = [model.camera(c).id for c in cameras]
        self._shadows = shadows
        self._rgb = np.empty((size, size, 3), dtype=np.uint8)
        self._depth = np.empty((size, size), dtype=np.float32)
        extent = model.stat.extent
        self._near = model.vis.map.znear * extent
        self._far = model.vis.map.zfar * extent

    def render(self, data: mujoco.MjData, rgb: bool, depth: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Returns (rgb (3V,H,W) uint8 or None, depth (V,H,W) float32 metres or None)."""
        self._make_current()
        rgbs, depths = [], []
        for cam in self._cam_ids:
            self._cam.fixedcamid = cam
            mujoco.mjv_updateScene(
                self.model, data, self._opt, self._pert, self._cam, mujoco.mjtCatBit.mjCAT_ALL, self._scene
            )
            self._scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = self._shadows
            self._scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
            mujoco.mjr_render(self._rect, self._scene, self._ctx)
            mujoco.mjr_readPixels(self._rgb if rgb else None, self._depth if depth else None, self._rect, self._ctx)
            # OpenGL rows start at the bottom of the image.
            if rgb:
                rgbs.append(np.moveaxis(self._rgb[::-1], -1, 0).copy())  # buffer is reused
            if depth:
                depths.append(self._linear_depth(self._depth[::-1])[None])
        out_rgb = np.ascontiguousarray(np.concatenate(rgbs, 0)) if rgb else None
        out_depth = np.ascontiguousarray(np.concatenate(depths, 0)) if depth else None
        return out_rgb, out_depth

    def _make_current(self) -> None:
        # Every call: several renderers can share a thread, and freeing any GL context (mujoco<4 calls
        # eglReleaseThread) drops whichever context was current. It costs microseconds.
        self._gl.make_current()

    def _linear_depth(self, z_buffer: np.ndarray) -> np.ndarray:
        # Invert OpenGL's perspective depth mapping to distance along the view axis in metres.
        near, far = self._near, self._far
        lin = near / (1.0 - z_buffer * (1.0 - near / far))
        return np.minimum(lin, DEPTH_MAX).astype(np.float32)

    def close(self) -> None:
        if self._gl is not None:
            self._make_current()
            self._ctx.free()
            self._gl.free()
            self._gl = None
