"""MP4 frames in and out through PyAV (FFmpeg): one decoder walks a file forward, one encoder appends episodes.

LeRobotDataset v3 concatenates many episodes into one mp4 per camera; an episode is the frames at
``from_timestamp + i / fps``. Reading the episodes in file order lets one decoder stream each file once, so
memory holds one episode's frames, never a whole video.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np

# SVT-AV1 (lerobot's default codec) prints a banner per stream on stderr unless told to keep to errors.
os.environ.setdefault("SVT_LOG", "1")


@contextlib.contextmanager
def keep_scheduling() -> Iterator[None]:
    """Give the calling thread back its scheduling policy after encoding. SVT-AV1 (libsvtav1) switches the thread
    that opens it to real-time SCHED_FIFO where it may (as root): left so, this process and every process it starts
    later (collectors, evaluation envs) would run real-time and starve the rest of the machine."""
    if not hasattr(os, "sched_getscheduler"):  # not Linux
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if os.sched_getscheduler(0) != policy or os.sched_getparam(0) != param:
            os.sched_setscheduler(0, policy, param)


def _av():  # noqa: ANN202 - PyAV is the optional `data` extra; import it where it is used
    try:
        import av
    except ImportError as e:
        raise RuntimeError("reading/writing mp4 needs PyAV: pip install 'dmrl[data]'") from e
    return av


class FrameReader:
    """Sequential frame access to mp4 files: ``frames(path, times, fps)`` -> (n, H, W, 3) uint8.

    Each frame is matched to its timestamp within half a frame period. A request behind the decoder's position (or
    in another file) reopens the file and seeks to the keyframe before it. ``size``: (H, W) to resize to.
    """

    def __init__(self, size: tuple[int, int] | None = None) -> None:
        self.size = size
        self._path: Path | None = None
        self._container = None
        self._frames = None  # iterator of decoded frames
        self._pending = None  # a decoded frame not consumed yet (it belongs to a later timestamp)

    def frames(self, path: Path, times: np.ndarray, fps: float) -> np.ndarray:
        """(n, H, W, 3) uint8 frames at the n increasing ``times`` (seconds into the file)."""
        tol = 0.5 / fps
        t0 = float(times[0])
        if self._path != path or self._pending is None or self._pending.time > t0 + tol:
            self._open(path, t0)
        out: list[np.ndarray] = []
        for target in times.tolist():
            frame = self._next_at(target, tol, path)
            h, w = self.size if self.size is not None else (frame.height, frame.width)
            out.append(frame.to_ndarray(format="rgb24", width=w, height=h))
        return np.stack(out)

    def _open(self, path: Path, t0: float) -> None:
        av = _av()
        self.close()
        if not path.is_file():
            raise FileNotFoundError(f"video {path}: missing (the dataset's meta/info.json video_path points here)")
        try:
            self._container = av.open(str(path))
            stream = self._container.streams.video[0]
        except (av.error.FFmpegError, IndexError) as e:
            raise ValueError(f"video {path}: unreadable ({type(e).__name__}); re-download or re-encode it") from None
        if t0 > 0 and stream.time_base is not None:
            self._container.seek(int(t0 / stream.time_base), stream=stream, backward=True, any_frame=False)
        self._path, self._frames, self._pending = path, self._container.decode(stream), None
        self._pending = next(self._frames, None)

    def _next_at(self, target: float, tol: float, path: Path):  # noqa: ANN202 - an av.VideoFrame
        while self._pending is not None and self._pending.time < target - tol:
            self._pending = next(self._frames, None)  # type: ignore[arg-type]
        frame = self._pending
        if frame is None or abs(frame.time - target) > tol:
            got = "the end of the file" if frame is None else f"a frame at {frame.time:.4f}s"
            raise ValueError(f"video {path}: no frame at {target:.4f}s (found {got}); is info.json's fps right?")
        self._pending = next(self._frames, None)  # type: ignore[arg-type]
        return frame

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
        self._container, self._frames, self._pending, self._path = None, None, None, None


class FrameWriter:
    """One mp4 stream written frame by frame at a constant ``fps``; frame i has timestamp i / fps.

    ``count`` frames written so far."""

    def __init__(self, path: Path, fps: float, height: int, width: int, vcodec: str, crf: int, g: int, pix_fmt: str):
        av = _av()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.count = path, 0
        self.rate = Fraction(fps).limit_denominator(1001)  # 30, or 30000/1001 for NTSC's 29.97
        self._container = av.open(str(path), "w")
        options = {"g": str(g), "crf": str(crf)}
        try:
            self._stream = self._container.add_stream(vcodec, rate=self.rate, options=options)
        except (av.error.FFmpegError, ValueError) as e:
            self._container.close()
            raise ValueError(
                f"--vcodec {vcodec}: this FFmpeg cannot encode it ({e}); try libsvtav1 or libx264"
            ) from None
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, pix_fmt
        self.codec = vcodec

    def write(self, frames: np.ndarray) -> None:
        """Append (n, H, W, 3) uint8 frames."""
        av = _av()
        with keep_scheduling():  # the encoder opens at the first frame
            for img in frames:
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
                frame.pts, frame.time_base = self.count, 1 / self.rate
                for packet in self._stream.encode(frame):
                    self._container.mux(packet)
                self.count += 1

    def close(self) -> None:
        """Flush the encoder and finish the file."""
        with keep_scheduling():
            for packet in self._stream.encode():
                self._container.mux(packet)
            self._container.close()


def video_info(path: Path) -> dict[str, object]:
    """The ``info`` block LeRobot keeps per video feature in meta/info.json."""
    av = _av()
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return {
            "video.height": s.height,
            "video.width": s.width,
            "video.codec": s.codec_context.codec.canonical_name if s.codec_context else "unknown",
            "video.pix_fmt": s.pix_fmt,
            "video.is_depth_map": False,
            "video.fps": int(s.base_rate) if s.base_rate else None,
            "video.channels": 3,
            "has_audio": False,
        }
