"""A worker process's result sink (`vdet.workers.child._Forwarder`): results are encoded as
they are published and sent on `flush`, all of them as one `PublishedBatch`, in order, over a
real pipe; results of streams it was not told about are not sent."""

from __future__ import annotations

import multiprocessing

import numpy as np

from vdet.core.types import DetectionResult, Detections, StageTimings
from vdet.workers.channel import Channel, Published, PublishedBatch
from vdet.workers.child import _Forwarder


def _result(source_id: str, frame_index: int) -> DetectionResult:
    detections = Detections(
        np.array([[10, 20, 110, 220]], np.float32), np.array([0.9], np.float32), np.array([1])
    )
    return DetectionResult(
        source_id=source_id,
        frame_index=frame_index,
        pts_seconds=frame_index / 30,
        arrival_time=100.0,
        published_time=100.01,
        image_size_wh=(1920, 1080),
        detections=detections,
        timings=StageTimings(inference=0.002, end_to_end=0.01),
    )


def test_flush_sends_what_was_published_as_one_batch_in_order() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    api_end = Channel(ours)
    forwarder = _Forwarder(Channel(theirs))
    forwarder.class_names = ("person", "car")
    forwarder.bind("cam", 7)
    for n in range(3):
        forwarder.publish(_result("cam", n))
    forwarder.publish(_result("never-added", 0))
    assert not api_end.conn.poll(0.1)  # kept until the flush
    forwarder.flush()
    batch = api_end.recv()
    assert isinstance(batch, PublishedBatch)
    assert [type(p) for p in batch.results] == [Published] * 3
    assert [(p.handle, p.source_id, p.frame_index) for p in batch.results] == [
        (7, "cam", 0),
        (7, "cam", 1),
        (7, "cam", 2),
    ]
    assert '"car"' in batch.results[0].encoded_tail  # encoded with the model's class names
    assert batch.results[0].observed.inference == 0.002
    forwarder.flush()  # nothing new: nothing is sent
    assert not api_end.conn.poll(0.1)
