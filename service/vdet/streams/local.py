"""`LocalStreams`: the `StreamService` of streams that run in this process.

It holds what one process needs to run streams, built by the composition root (vdet.root):
the detector, the GPU devices when the backend feeds the GPU data path, and the stream manager
that runs every stream's threads. Each call goes to the manager; a stream's latest frame is
encoded here (`picture`). A one-process `vdet serve` runs its streams with it, and so does each
stream worker process (vdet.workers.child).
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from vdet.config.streams import StreamSpec
from vdet.core.contract import PostprocessParams
from vdet.core.types import Detections, ImageArray, StageTimings
from vdet.inference.detector import Detector
from vdet.streams.event_snapshots import EventSnapshot
from vdet.streams.manager import StreamManager
from vdet.streams.pictures import encode_frame
from vdet.streams.service import (
    BackendInfo,
    EncodedFrame,
    EventSnapshotList,
    Health,
    PictureRequest,
    StreamChanges,
    StreamView,
)

if TYPE_CHECKING:
    from vdet.gpu.devices import GpuPool  # imports torch: only where a GPU backend runs


class LocalStreams:
    """The streams of this process (module docstring); closing it closes what it holds.
    `seq_of(stream id, frame index)`: the seq of a published result, where the results hub
    numbers them later than `publish` (a fleet node's hub numbers its results as they come
    back off the bus, vdet.fleet.feed); None where `publish` numbers them."""

    def __init__(
        self,
        detector: Detector,
        gpu: GpuPool | None,
        manager: StreamManager,
        seq_of: Callable[[str, int], int | None] | None = None,
    ) -> None:
        self.detector = detector
        self._seq_of = seq_of
        self.gpu = gpu
        self.manager = manager
        info, backend = detector.info, detector.backend
        self._backend_info = BackendInfo(
            backend=backend.name,
            device=str(backend.device),
            model=f"{info.path.name}@{info.sha256[:12]}",
            # Not every backend states its precision; those that do not run fp32.
            precision=str(getattr(backend, "precision", "fp32")),
            class_names=tuple(info.names),
            data_path="gpu" if backend.gpu_data_path else "cpu",
            selection=backend.selection,
            input_hw=(int(info.input_hw[0]), int(info.input_hw[1])),
        )

    @property
    def backend_info(self) -> BackendInfo:
        return self._backend_info

    # --- StreamControl -----------------------------------------------------------------------

    def add(self, spec: StreamSpec) -> StreamView:
        return self.manager.add(spec)

    def change(self, stream_id: str, changes: StreamChanges) -> StreamView:
        return self.manager.change(stream_id, changes)

    def remove(self, stream_id: str) -> None:
        self.manager.remove(stream_id)

    # --- StreamReads -------------------------------------------------------------------------

    def list(self) -> builtins.list[StreamView]:
        return self.manager.list()

    def get(self, stream_id: str) -> StreamView:
        return self.manager.get(stream_id)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self.manager

    def picture(self, stream_id: str, request: PictureRequest) -> EncodedFrame | None:
        frame = encode_picture(self.manager, stream_id, request)
        if frame is not None and frame.seq == 0 and self._seq_of is not None:
            # Its result is unnumbered until it comes back off the bus (as a worker's is,
            # vdet.workers.pool.WorkerPool.picture); 0 stays when it has not yet.
            seq = self._seq_of(stream_id, frame.result_frame_index)
            if seq is not None:
                frame = dataclasses.replace(frame, seq=seq)
        return frame

    def event_snapshots(self, stream_id: str) -> EventSnapshotList:
        return self.manager.event_snapshots(stream_id)

    def event_snapshot(self, stream_id: str, frame_index: int) -> EventSnapshot | None:
        return self.manager.event_snapshot(stream_id, frame_index)

    def detect(
        self, image_bgr: ImageArray, params: PostprocessParams
    ) -> tuple[Detections, StageTimings]:
        ((detections, timings),) = self.detector.detect([image_bgr], params)
        return detections, timings

    # --- upkeep ------------------------------------------------------------------------------

    def describe(self) -> str:
        gpu = f"; GPU devices: {self.gpu.describe()}" if self.gpu is not None else ""
        return f"{self._backend_info.backend} on {self._backend_info.device}{gpu}"

    def sync_metrics(self) -> None:
        self.manager.sync_metrics()

    def health(self) -> Health:
        """Source statuses and GPU use, for a process that keeps the metrics elsewhere (a
        stream worker process's answer to the API process)."""
        sources = tuple((view.spec.id, view.status) for view in self.manager.list())
        snapshots = tuple((s, self.manager.event_snapshot_counts(s)) for s, _ in sources)
        if self.gpu is None:
            return Health(sources, (("cpu", len(sources), None),), snapshots)
        counts = self.gpu.streams_by_gpu()
        gpus = tuple((w.label, counts.get(w.label, 0), w.memory_bytes()) for w in self.gpu.devices)
        return Health(sources, gpus, snapshots)

    def close(self) -> None:
        try:
            self.manager.close()
        finally:
            try:
                if self.gpu is not None:
                    self.gpu.close()
            finally:
                self.detector.close()


def encode_picture(
    manager: StreamManager, stream_id: str, request: PictureRequest
) -> EncodedFrame | None:
    """`StreamReads.picture` for a stream of `manager`. Raises UnknownStreamError."""
    # Cheap until the picture is known to be wanted: no copy, no GPU download before.
    snap = manager.newest_frame(stream_id) if request.newest else manager.snapshot(stream_id)
    if snap is None:
        return None
    frame, result = snap.frame, snap.result
    shows = (frame.index, result.frame_index if request.boxes else None)
    if request.unless is not None and shows == request.unless:
        return None
    image = manager.host_image(stream_id, frame)
    jpeg, (w, h) = encode_frame(
        image,
        result.detections if request.boxes else None,
        manager.class_names,
        quality=request.quality,
        max_width=request.max_width,
    )
    source_h, source_w = image.shape[:2]
    return EncodedFrame(
        seq=result.seq,
        jpeg=jpeg,
        width=w,
        height=h,
        source_width=source_w,
        source_height=source_h,
        frame_index=frame.index,
        result_frame_index=result.frame_index,
        boxes_drawn=request.boxes,
    )
