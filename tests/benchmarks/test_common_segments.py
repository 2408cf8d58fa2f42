"""benchmarks/_common.py's segment timing: a training segment's minutes are recorded also when it fails, and a
resumed run's segments add up (an unrecorded one makes the total incomplete)."""

import json

import pytest

from script_module import script_module


@pytest.fixture(scope="module")
def common():
    yield from script_module("benchmarks/_common.py", "bench_common")


def test_a_failing_segment_is_still_recorded_after_the_earlier_ones(common, tmp_path):
    path = tmp_path / "segments.json"
    earlier = [{"minutes": 2.0, "cpu_minutes": 3.0, "load": [1.0]}]
    segments = list(earlier)
    with pytest.raises(KeyboardInterrupt), common.timed_segment(path, segments):
        sum(i * i for i in range(200_000))  # some CPU time
        raise KeyboardInterrupt
    written = json.loads(path.read_text())
    assert written == segments and len(written) == 2 and written[0] == earlier[0]
    new = written[1]
    assert 0 < new["minutes"] < 1 and 0 <= new["cpu_minutes"] < 1 and len(new["load"]) == 1  # sampled at the start


def test_totals_add_segments_and_flag_an_unrecorded_one(common):
    segments = [
        {"minutes": 10.04, "cpu_minutes": 19.0, "load": [2.0, 4.0]},
        {"minutes": 5.0, "cpu_minutes": 9.0, "load": [1.0]},
    ]
    totals = common.segment_totals(segments)
    assert totals == {
        "wall_minutes": 15.0,
        "cpu_minutes": 28.0,
        "segments": 2,
        "minutes_complete": True,
        "load_mean": 2.33,
        "load_max": 4.0,
    }
    gap = common.segment_totals([{"minutes": None, "cpu_minutes": None, "load": []}, *segments])
    assert (gap["wall_minutes"], gap["segments"], gap["minutes_complete"]) == (15.0, 3, False)
