"""One stream's tracking: its tracker and its zones, applied to each detected frame in order.

The stream manager keeps one `StreamTracking` per stream and calls `update` on the stream's
own pipeline thread, after detection and before the result is published; everything it
returns is plain data that rides on the frame's `DetectionResult` (track ids on the
detections, events, a summary), so nothing downstream needs the tracker. Settings and zones
are passed in with every frame: a change made through the API applies from the next frame
without any lock here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vdet.core.types import Detections, TrackingSummary, ZoneEvent
from vdet.tracking.bytetrack import ByteTracker, TrackerParams
from vdet.tracking.zones import Zone, ZoneMonitor


@dataclass(frozen=True)
class TrackedFrame:
    detections: Detections  # with tracker_id
    events: tuple[ZoneEvent, ...]
    summary: TrackingSummary


class StreamTracking:
    """Tracks and zone state of one stream; used by one thread at a time, in frame order."""

    def __init__(self) -> None:
        self._tracker: ByteTracker | None = None
        self._monitor = ZoneMonitor()

    def update(
        self,
        detections: Detections,
        size_wh: tuple[int, int],
        time_s: float,
        params: TrackerParams,
        zones: tuple[Zone, ...] = (),
    ) -> TrackedFrame:
        """Track one frame's detections; `time_s` (seconds, any origin) times dwell."""
        if self._tracker is None:
            self._tracker = ByteTracker(params)
        else:
            self._tracker.params = params  # new thresholds apply to the tracks there are
        update = self._tracker.update(detections)
        tracked = replace(detections, tracker_id=update.tracker_id)
        self._monitor.set_zones(zones)
        events, occupancy = self._monitor.update(tracked, size_wh, time_s, update.ended_ids)
        summary = TrackingSummary(tracks_started=update.started_classes, occupancy=occupancy)
        return TrackedFrame(tracked, events, summary)

    def reset(self) -> None:
        """Forget every track (tracking was turned off); zone state goes with them."""
        self._tracker = None
        self._monitor = ZoneMonitor()
