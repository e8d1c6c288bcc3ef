"""The wire text of a result event, whether the API process encodes it or a worker process
encoded it ahead (`encoded_tail`): both must be the same bytes for every kind of result."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from vdet.core.types import (
    DetectionResult,
    Detections,
    StageTimings,
    TrackingSummary,
    ZoneEvent,
)
from vdet.results.hub import EncodedResult
from vdet.results.wire import (
    DetectionResultOut,
    ResultEventEncoder,
    encode_result_tail,
    result_out,
    result_text,
)

NAMES = ("person", "car", "dog")


def _result(seed: int, n: int, *, tracked: bool) -> DetectionResult:
    rng = np.random.default_rng(seed)
    xyxy = (rng.random((n, 4)) * 1000).astype(np.float32)
    xyxy[:, 2:] += xyxy[:, :2]
    detections = Detections(
        xyxy,
        rng.random(n).astype(np.float32),
        rng.integers(0, len(NAMES), n).astype(np.int32),
        rng.integers(-1, 50, n).astype(np.int32) if tracked else None,
    )
    events = (ZoneEvent(type="zone_enter", zone="door", track_id=3, class_id=0),) if tracked else ()
    return DetectionResult(
        source_id=f"cam-{seed}",
        frame_index=seed * 7,
        pts_seconds=None if seed % 2 else seed / 30,
        arrival_time=1_700_000_000.0 + seed,
        published_time=1_700_000_000.01 + seed,
        image_size_wh=(1920, 1080),
        detections=detections,
        timings=StageTimings(0.001, 0.002, 0.003, 0.0005, 0.007),
        events=events,
        tracking=TrackingSummary() if tracked else None,
    )


@pytest.mark.parametrize("n", [0, 1, 17])
@pytest.mark.parametrize("tracked", [False, True])
@pytest.mark.parametrize("seq", [1, 9, 123_456_789])
def test_a_worker_encoded_result_is_the_same_text_as_one_encoded_here(
    n: int, tracked: bool, seq: int
) -> None:
    made = _result(seq % 5 + n, n, tracked=tracked)  # as a worker has it: no seq yet
    here = ResultEventEncoder().encode(dataclasses.replace(made, seq=seq), NAMES)
    tail = encode_result_tail(made, NAMES)
    there = ResultEventEncoder().encode(
        dataclasses.replace(made, seq=seq, encoded_tail=tail), NAMES
    )
    assert there == here
    event = json.loads(there)
    assert event["type"] == "result" and event["result"]["seq"] == seq
    assert len(event["result"]["detections"]) == n


@pytest.mark.parametrize("n", [0, 1, 17])
@pytest.mark.parametrize("tracked", [False, True])
def test_the_latest_detections_served_from_a_worker_text_equal_those_built_from_the_result(
    n: int, tracked: bool
) -> None:
    """GET .../detections answers a worker's result from its wire text; a client must read the
    same JSON as from the result itself (`result_out`, what the one-process service serves)."""
    made = _result(n + 3, n, tracked=tracked)
    encoded = EncodedResult(77, made.source_id, made.frame_index, encode_result_tail(made, NAMES))
    served = json.loads(result_text(encoded))
    built = json.loads(result_out(dataclasses.replace(made, seq=77), NAMES).model_dump_json())
    assert served == built
    assert DetectionResultOut.model_validate_json(result_text(encoded)).seq == 77


def test_a_wire_text_that_does_not_end_with_the_result_is_refused() -> None:
    with pytest.raises(AssertionError, match="ends"):
        result_text(EncodedResult(1, "cam", 0, ',"source_id":"cam"},"extra":1'))
