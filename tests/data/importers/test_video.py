"""The mp4 writer leaves the process's scheduling as it found it (SVT-AV1 makes the encoding thread real-time)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dmrl.data.importers.video import FrameWriter


@pytest.mark.parametrize("vcodec", ["libsvtav1", "libx264"])
def test_encoding_keeps_the_scheduling_policy(tmp_path, vcodec):
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    w = FrameWriter(tmp_path / "v.mp4", 10, 32, 32, vcodec, crf=30, g=2, pix_fmt="yuv420p")
    w.write(np.zeros((4, 32, 32, 3), np.uint8))
    w.close()
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
