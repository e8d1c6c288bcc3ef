"""FrameSampler: which frames a stream's detect_fps keeps, on the frames' own clock."""

from __future__ import annotations

import itertools

import pytest

from vdet.ingest.sampling import FrameSampler


def kept(sampler: FrameSampler, times: list[float]) -> list[float]:
    return [t for t in times if sampler.take(t)]


def frames(fps: float, seconds: float, start: float = 0.0) -> list[float]:
    return [start + i / fps for i in range(round(fps * seconds))]


def test_without_a_rate_every_frame_is_kept() -> None:
    times = frames(30, 1)
    assert kept(FrameSampler(None), times) == times


@pytest.mark.parametrize(
    ("source_fps", "detect_fps", "every"),
    [(30, 10, 3), (30, 15, 2), (25, 5, 5), (30, 30, 1), (30, 60, 1), (29.97, 10, 3)],
)
def test_whole_divisions_keep_every_nth_frame(
    source_fps: float, detect_fps: float, every: int
) -> None:
    times = frames(source_fps, 4)
    assert kept(FrameSampler(detect_fps), times) == times[::every]


def test_an_uneven_division_keeps_the_rate_on_average() -> None:
    # 20 of 30: frames can only be 1 or 2 apart, and the grid decides which, without drift.
    times = frames(30, 10)
    picked = kept(FrameSampler(20), times)
    assert len(picked) == 200
    assert {round((b - a) * 30) for a, b in itertools.pairwise(picked)} == {1, 2}


def test_jittered_timestamps_stay_on_the_grid() -> None:
    # Arrival times of a live camera wander by a few ms; the picks still come every 3rd frame.
    jitter = [0.004, -0.006, 0.002, -0.003, 0.005, 0.0]
    times = [t + jitter[i % len(jitter)] for i, t in enumerate(frames(30, 4))]
    picked = kept(FrameSampler(10), times)
    assert len(picked) == 40
    assert {times.index(t) % 3 for t in picked} == {0}


def test_a_jump_forward_restarts_the_grid_without_a_burst() -> None:
    sampler = FrameSampler(10)
    assert kept(sampler, frames(30, 1)) == frames(30, 1)[::3]
    after_stall = frames(30, 1, start=60.0)  # a reconnect a minute later
    assert kept(sampler, after_stall) == after_stall[::3]


def test_a_clock_that_goes_back_starts_over() -> None:
    # A looped file's timestamps start at 0 again.
    sampler = FrameSampler(10)
    first, again = frames(30, 1), frames(30, 1)
    assert kept(sampler, first) + kept(sampler, again) == first[::3] + again[::3]


def test_changing_the_rate_applies_from_the_next_frame() -> None:
    sampler = FrameSampler(10)
    times = frames(30, 2)
    assert kept(sampler, times[:30]) == times[:30:3]
    sampler.set_rate(15)
    assert kept(sampler, times[30:]) == times[30::2]
    sampler.set_rate(None)
    assert sampler.fps is None
    assert sampler.take(100.0) and sampler.take(100.0)


@pytest.mark.parametrize("fps", [0, -1, float("nan"), True])
def test_rate_must_be_positive(fps: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        FrameSampler(fps)
