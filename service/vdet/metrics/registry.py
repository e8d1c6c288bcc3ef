"""Every Prometheus metric vdet exports, defined once, here, with its unit in its name.

Each app instance owns a `Metrics` with its own `CollectorRegistry`, so several apps (tests)
can live in one process. Other modules report through the methods below and never create
metrics of their own; this module never reaches into streams, workers or the hub.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from vdet.core.types import DetectionResult, SourceState, SourceStatus, TrackingSummary, ZoneEvent

# 1 ms .. 2 s, roughly x2 per step with a finer grid where real-time budgets sit (5-50 ms).
LATENCY_BUCKETS_SECONDS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.0,
)
# Webhook deliveries: a healthy endpoint within the latency grid, retries out to minutes.
DELIVERY_BUCKETS_SECONDS: tuple[float, ...] = (*LATENCY_BUCKETS_SECONDS, 5.0, 15.0, 60.0, 300.0)
# 0.5 ms .. 2 s: a healthy event loop wakes within a millisecond of when it asked to.
LOOP_LAG_BUCKETS_SECONDS: tuple[float, ...] = (0.0005, *LATENCY_BUCKETS_SECONDS)
STAGES: tuple[str, ...] = ("decode", "preprocess", "inference", "postprocess")
CONTENT_TYPE = CONTENT_TYPE_LATEST
# Frames observed but not yet folded into the histograms: past this many they are folded at
# once, on the observing thread (a few milliseconds), so that memory stays bounded when nobody
# scrapes.
FOLD_AT = 2048


@dataclass
class ZoneCounts:
    """Per zone, the tracks inside it now by class; per line, crossings by direction and class."""

    objects: dict[str, dict[str, int]] = field(default_factory=dict)
    crossings: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)


class ResultObservation(NamedTuple):
    """What the metrics take from one published result: its stage seconds (in `STAGES` order,
    then end to end) and what its stream's tracker added. A stream worker process sends this
    with each result, so that the API process never unpickles the result to count it."""

    source_id: str
    decode: float
    preprocess: float
    inference: float
    postprocess: float
    end_to_end: float
    tracking: TrackingSummary | None
    events: tuple[ZoneEvent, ...]

    @classmethod
    def of(cls, result: DetectionResult) -> ResultObservation:
        t = result.timings
        return cls(
            result.source_id,
            t.decode,
            t.preprocess,
            t.inference,
            t.postprocess,
            t.end_to_end,
            result.tracking,
            result.events,
        )


@dataclass
class _FrameSeries:
    """One source's children of the series every frame updates, looked up once when the source
    is added: `labels()` costs microseconds per call, and every stream's pipeline thread would
    otherwise make seven of them per frame."""

    stages: tuple[Any, ...]  # Histogram children, in STAGES order
    end_to_end: Any
    processed: Any
    gpu_processed: Any
    slot: int  # its number among the pending frames (`Metrics.fold`)


_SNAPSHOT_OUTCOMES = ("kept", "skipped", "failed")


@dataclass
class _SourceTotals:
    """The last cumulative counts seen for one source, to turn snapshots into increments."""

    decoded: int = 0
    dropped: int = 0
    reconnects: int = 0
    decode_errors: int = 0
    damaged: int = 0
    skipped: int = 0
    # Event snapshots kept, skipped, failed (the stream manager's counts).
    snapshots: tuple[int, int, int] = (0, 0, 0)
    gpu: str = "cpu"
    decode_path: tuple[str, str] | None = None  # (path, reason) labels set now
    series: _FrameSeries | None = None
    zone_series: set[tuple[str, str]] = field(default_factory=set)  # (zone, class) gauges set


class Metrics:
    """The metrics of one app instance and the small API the rest of vdet reports through."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # Per-frame observations wait in `_pending` and are folded into the histograms and
        # counters in bulk whenever the registry is collected (this collector comes first).
        self._pending: list[tuple[int, float, float, float, float, float]] = []
        self._pending_lock = threading.Lock()
        self._slots: dict[int, _FrameSeries] = {}  # the series of each source, by slot
        self._next_slot = 0
        r.register(_FoldFirst(self))
        self.stage_latency = Histogram(
            "vdet_stage_latency_seconds",
            "Seconds one frame spent in a pipeline stage.",
            ["source", "stage"],
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.end_to_end_latency = Histogram(
            "vdet_end_to_end_latency_seconds",
            "Seconds from a frame's packet arrival to its result being published.",
            ["source"],
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.frames_decoded = Counter(
            "vdet_frames_decoded_total", "Frames decoded from a source.", ["source"], registry=r
        )
        self.frames_processed = Counter(
            "vdet_frames_processed_total",
            "Frames that went through detection and were published.",
            ["source"],
            registry=r,
        )
        self.frames_dropped = Counter(
            "vdet_frames_dropped_total",
            "Decoded frames lost because detection was still busy with an earlier one.",
            ["source"],
            registry=r,
        )
        self.frames_skipped = Counter(
            "vdet_frames_skipped_total",
            "Decoded frames left out of detection by the stream's detect_fps (by design: "
            "frames_dropped counts those lost to a busy detector).",
            ["source"],
            registry=r,
        )
        self.decode_errors = Counter(
            "vdet_decode_errors_total",
            "Packets of a source its decoder rejected.",
            ["source"],
            registry=r,
        )
        self.frames_damaged = Counter(
            "vdet_frames_damaged_total",
            "Decoded frames of a damaged reference chain (after a decode error or a frame the "
            "decoder flagged corrupt, until the next keyframe): dropped unless "
            "ingest.pass_damaged_frames.",
            ["source"],
            registry=r,
        )
        self.source_reconnects = Counter(
            "vdet_source_reconnects_total",
            "Times a source was reopened after an error, end of stream or stall.",
            ["source"],
            registry=r,
        )
        self.inference_eager_fallbacks = Counter(
            "vdet_inference_eager_fallbacks_total",
            "Inference calls that could not replay a captured CUDA graph and ran eagerly.",
            registry=r,
        )
        self.source_state = Gauge(
            "vdet_source_state",
            "1 for the state a source thread is in now, 0 for the others.",
            ["source", "state"],
            registry=r,
        )
        self.source_last_frame_age = Gauge(
            "vdet_source_last_frame_age_seconds",
            "Seconds since a source last delivered a decoded frame (absent before the first).",
            ["source"],
            registry=r,
        )
        self.websocket_clients = Gauge(
            "vdet_websocket_clients", "WebSocket event clients connected now.", registry=r
        )
        self.streams = Gauge("vdet_streams", "Streams configured now.", registry=r)
        self.event_snapshots = Counter(
            "vdet_event_snapshots_total",
            "Event snapshots (JPEGs of the frames with zone or line events) by outcome: kept, "
            "skipped (the encoder was behind) or failed.",
            ["source", "outcome"],
            registry=r,
        )
        self.streams_file_write_failures = Counter(
            "vdet_streams_file_write_failures_total",
            "Changes to the streams that could not be written to `streams_file` (in effect, "
            "but lost at a restart unless a later change is written).",
            registry=r,
        )
        self.live_viewers = Gauge(
            "vdet_live_viewers", "Live video (MJPEG) responses open now.", registry=r
        )
        self.live_encode_seconds = Histogram(
            "vdet_live_encode_seconds",
            "Time to draw, scale and JPEG-encode one live frame (shared by the viewers of the "
            "same stream and size).",
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.live_frames_sent = Counter(
            "vdet_live_frames_sent_total", "Live video frames sent, all viewers.", registry=r
        )
        self.webhook_deliveries = Counter(
            "vdet_webhook_deliveries_total",
            "Webhook deliveries (one per result with matching events) by how they ended: "
            "delivered (2xx), failed (a 4xx other than 429, or out of attempts), dropped (the "
            "endpoint's queue was full, or shutdown came first).",
            ["webhook", "outcome"],
            registry=r,
        )
        self.webhook_retries = Counter(
            "vdet_webhook_retries_total",
            "Webhook delivery attempts made again after a connection error, timeout, 429 or 5xx.",
            ["webhook"],
            registry=r,
        )
        self.webhook_delivery_seconds = Histogram(
            "vdet_webhook_delivery_seconds",
            "From a result's publish to its events' delivery (2xx), retries included.",
            ["webhook"],
            buckets=DELIVERY_BUCKETS_SECONDS,
            registry=r,
        )
        self.webhook_pending = Gauge(
            "vdet_webhook_pending",
            "Webhook deliveries waiting to go out now.",
            ["webhook"],
            registry=r,
        )
        self.notify_results_missed = Counter(
            "vdet_notify_results_missed_total",
            "Results the webhooks and MQTT never saw: they had left the replay buffer when the "
            "notifier's reader, cut off as lagging, resumed (their events, if any, were not sent).",
            registry=r,
        )
        self.mqtt_messages = Counter(
            "vdet_mqtt_messages_total",
            "MQTT event messages by how they ended: published (sent at QoS 0, acknowledged at 1 "
            "and 2) or dropped (paho's queue full, or QoS 0 without a connection).",
            ["outcome"],
            registry=r,
        )
        self.mqtt_connected = Gauge(
            "vdet_mqtt_connected",
            "1 while connected to the MQTT broker (host:port), else 0; absent without one.",
            ["broker"],
            registry=r,
        )
        self.backend = Info("vdet_backend", "The inference backend serving detections.", registry=r)
        self.gpu_memory_used = Gauge(
            "vdet_gpu_memory_used_bytes",
            "GPU memory this process holds in torch's caching allocator, per GPU device "
            "(networks, graphs, frames; NVDEC's own surfaces are not included).",
            ["gpu"],
            registry=r,
        )
        self.source_gpu = Gauge(
            "vdet_source_gpu",
            "1 for the GPU device a source runs on ('cpu' without one); join on `source`.",
            ["source", "gpu"],
            registry=r,
        )
        self.source_decode_path = Gauge(
            "vdet_source_decode_path",
            "1 for the decoder of a source's current sequence (path: nvdec or cpu) and, on a GPU "
            "node decoding it on the CPU, why (reason: configured, unavailable, codec, format, "
            "size, pipeline; none otherwise).",
            ["source", "path", "reason"],
            registry=r,
        )
        self.gpu_streams = Gauge(
            "vdet_gpu_streams", "Streams placed on each GPU device now.", ["gpu"], registry=r
        )
        self.gpu_frames_processed = Counter(
            "vdet_gpu_frames_processed_total",
            "Frames published by the streams of each GPU device ('cpu' without one).",
            ["gpu"],
            registry=r,
        )
        self.worker_up = Gauge(
            "vdet_worker_up",
            "1 while a stream worker process (or spare) runs and answers, 0 while it is being "
            "restarted.",
            ["worker", "gpu"],
            registry=r,
        )
        self.worker_restarts = Counter(
            "vdet_worker_restarts_total",
            "Times a stream worker process died and was started again.",
            ["worker", "gpu"],
            registry=r,
        )
        self.mps_active = Gauge(
            "vdet_mps_active",
            "1 when the worker processes share their GPU through NVIDIA MPS, else 0.",
            registry=r,
        )
        self.clips = Counter(
            "vdet_clips_total",
            "Event clips by outcome: written, or why not (disk_full, permission, busy: the "
            "writer was behind, error).",
            ["source", "outcome"],
            registry=r,
        )
        self.clip_bytes = Counter(
            "vdet_clip_bytes_total", "Bytes of event clips written.", ["source"], registry=r
        )
        self.clips_disk_bytes = Gauge(
            "vdet_clips_disk_bytes",
            "Bytes the kept event clips take in the clips folder, all streams (as last read).",
            registry=r,
        )
        self.zone_objects = Gauge(
            "vdet_zone_objects",
            "Tracks inside a polygon zone now, by class (a track stays counted while briefly "
            "unseen, until its tracker ends it).",
            ["source", "zone", "class"],
            registry=r,
        )
        self.line_crossings = Counter(
            "vdet_line_crossings_total",
            "Tracks that crossed a counting line, by class and direction (in / out).",
            ["source", "zone", "class", "direction"],
            registry=r,
        )
        self.tracks_started = Counter(
            "vdet_tracks_started_total",
            "Tracks confirmed (given an id) by a stream's tracker, by class.",
            ["source", "class"],
            registry=r,
        )
        self.event_loop_lag = Histogram(
            "vdet_api_event_loop_lag_seconds",
            "How late the API process's event loop woke from a short sleep (a stall of the "
            "loop or of the whole process: every WebSocket message and request waits that long).",
            buckets=LOOP_LAG_BUCKETS_SECONDS,
            registry=r,
        )
        self.gc_pause = Histogram(
            "vdet_api_gc_pause_seconds",
            "Time of each garbage collection in the API process, by generation (0, 1, 2 = full); "
            "every thread of the process waits for it.",
            ["generation"],
            buckets=LOOP_LAG_BUCKETS_SECONDS,
            registry=r,
        )
        self.fleet_nodes = Gauge(
            "vdet_fleet_nodes",
            "Live nodes of the fleet as this node sees them (settings `cluster`).",
            registry=r,
        )
        self.fleet_leases = Gauge(
            "vdet_fleet_leases_held",
            "Streams whose lease this node holds (the streams it runs for the fleet).",
            registry=r,
        )
        self.fleet_unowned = Gauge(
            "vdet_fleet_unowned_streams",
            "Desired streams of the fleet that no node runs now (waiting for room, or for a "
            "dead node's lease to expire).",
            registry=r,
        )
        self.fleet_lease_events = Counter(
            "vdet_fleet_lease_events_total",
            "What this node did with leases: claimed, started, changed (in place), released "
            "(handed off or removed), lost (taken by another), fenced (not renewed in time: "
            "stopped here), failed (could not start the stream).",
            ["event"],
            registry=r,
        )
        self.fleet_results = Counter(
            "vdet_fleet_results_total",
            "This node's results and the results bus: published, fenced (no lease: not "
            "published), failed (not acknowledged), dropped (the outgoing queue was full), read "
            "(off the bus, every node's), ignored (off the bus, not a result), gap (no longer "
            "on the servers when asked for).",
            ["outcome"],
            registry=r,
        )
        self.fleet_bus_ack = Histogram(
            "vdet_fleet_bus_ack_seconds",
            "Each result this node published: from its hand-off to the results bus to the NATS "
            "servers' acknowledgement (the bus's publish latency).",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.fleet_results_lag = Gauge(
            "vdet_fleet_results_lag",
            "Results on the bus after the last one this node read (its feed's lag behind the "
            "fleet; WebSocket clients of this node see the fleet this far behind).",
            registry=r,
        )
        self.fleet_notify_pending = Gauge(
            "vdet_fleet_notify_pending",
            "Results the fleet's shared notification consumer has not handed to a node yet "
            "(webhooks and MQTT behind by this many results), as this node last saw it.",
            registry=r,
        )
        self._fleet_results_seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._totals: dict[str, _SourceTotals] = {}
        self._class_names: tuple[str, ...] = ()

    # --- pipeline --------------------------------------------------------------------------

    def observe_result(self, result: DetectionResult) -> None:
        """Record one published result: its stage latencies, end-to-end latency and count."""
        self.observe(ResultObservation.of(result))

    def observe(self, seen: ResultObservation) -> None:
        """Record one published result (see `observe_result`).

        Called for every frame of every stream (by each stream's publishing thread, or by the
        API process's event loop for worker processes' results), so it takes no lock of ours
        but the pending list's: the frame's seconds wait there and are folded into the
        histograms in bulk at the next scrape (`fold`), where per-frame `observe()` calls cost
        about 50 us a frame. Tracking series are updated here (they keep per-stream state). A
        result racing its source's removal updates children already detached from the
        registry, which nobody sees.
        """
        totals = self._totals.get(seen.source_id)
        if totals is None or totals.series is None:
            return
        with self._pending_lock:
            pending = self._pending
            pending.append(
                (
                    totals.series.slot,
                    seen.decode,
                    seen.preprocess,
                    seen.inference,
                    seen.postprocess,
                    seen.end_to_end,
                )
            )
            full = len(pending) >= FOLD_AT
        if full:
            self.fold()
        if seen.tracking is not None or seen.events or totals.zone_series:
            self._observe_tracking(seen, totals)  # (also drops zone gauges of tracking off)

    def fold(self) -> None:
        """Fold the frames observed since the last fold into the histograms and counters: per
        stream, one bucket count and one sum per histogram instead of an `observe()` a frame.
        prometheus_client keeps a histogram's buckets non-cumulative (an observation goes to
        the first bucket whose bound holds it); its children's `_buckets`, `_sum` and
        `_upper_bounds` are not public API, so a child without them is observed one value at a
        time."""
        with self._pending_lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        # One row per frame: slot, then the stage seconds and end to end.
        frames = np.array(pending, dtype=np.float64)
        slots, row_group = np.unique(frames[:, 0].astype(np.int64), return_inverse=True)
        groups = len(slots)
        frame_counts = np.bincount(row_group, minlength=groups).tolist()
        series = [self._slots.get(slot) for slot in slots.tolist()]  # None: removed meanwhile
        for column in range(len(STAGES) + 1):
            children = [None if s is None else (*s.stages, s.end_to_end)[column] for s in series]
            _fold_histograms(children, row_group, groups, frames[:, column + 1])
        for s, count in zip(series, frame_counts, strict=True):
            if s is not None:
                s.processed.inc(count)
                s.gpu_processed.inc(count)

    def set_class_names(self, names: tuple[str, ...]) -> None:
        """The model's class names, for the `class` label of tracking series (else ids)."""
        self._class_names = tuple(names)

    def _class_label(self, class_id: int) -> str:
        names = self._class_names
        return names[class_id] if 0 <= class_id < len(names) else str(class_id)

    def _observe_tracking(self, result: ResultObservation, totals: _SourceTotals) -> None:
        """Zone occupancy, line crossings and started tracks of one result (its stream's
        publishing thread only, so `totals.zone_series` has one writer)."""
        source = result.source_id
        for event in result.events:
            if event.type == "line_cross" and event.direction is not None:
                label = self._class_label(event.class_id)
                self.line_crossings.labels(source, event.zone, label, event.direction).inc()
        summary = result.tracking or TrackingSummary()
        for class_id in summary.tracks_started:
            self.tracks_started.labels(source, self._class_label(class_id)).inc()
        current: set[tuple[str, str]] = set()
        for occupancy in summary.occupancy:
            key = (occupancy.zone, self._class_label(occupancy.class_id))
            self.zone_objects.labels(source, *key).set(occupancy.objects)
            current.add(key)
        # Occupancy lists zeros too: a series missing now is of a zone deleted or redrawn.
        for zone, label in totals.zone_series - current:
            self.zone_objects.remove(source, zone, label)
        totals.zone_series = current

    # --- sources ---------------------------------------------------------------------------

    # Per-source updates check, under the lock, that the source is still registered: a worker
    # thread reporting late must not recreate the series of a deleted stream.

    def add_source(self, source_id: str, state: SourceState, gpu: str = "cpu") -> None:
        """Create a new source's series at zero so dashboards see it before its first frame.

        `gpu` labels the GPU running it: a GPU index, or "cpu".
        """
        with self._lock:
            series = _FrameSeries(
                stages=tuple(self.stage_latency.labels(source_id, s) for s in STAGES),
                end_to_end=self.end_to_end_latency.labels(source_id),
                processed=self.frames_processed.labels(source_id),
                gpu_processed=self.gpu_frames_processed.labels(gpu),
                slot=self._next_slot,
            )
            self._next_slot += 1
            previous = self._totals.get(source_id)
            if previous is not None and previous.series is not None:
                self._slots.pop(previous.series.slot, None)
            self._slots[series.slot] = series
            self._totals[source_id] = _SourceTotals(gpu=gpu, series=series)
            self.source_gpu.labels(source_id, gpu).set(1.0)
            for counter in (
                self.frames_decoded,
                self.frames_processed,
                self.frames_dropped,
                self.frames_skipped,
                self.source_reconnects,
            ):
                counter.labels(source_id)
            for outcome in _SNAPSHOT_OUTCOMES:
                self.event_snapshots.labels(source_id, outcome)
        self.set_source_state(source_id, state)

    def set_source_state(self, source_id: str, state: SourceState) -> None:
        with self._lock:
            if source_id not in self._totals:
                return
            for s in SourceState:
                self.source_state.labels(source_id, s.value).set(1.0 if s is state else 0.0)

    def sync_source(
        self,
        source_id: str,
        status: SourceStatus,
        now: float | None = None,
    ) -> None:
        """Fold a source's cumulative counts (its source thread's status) into the counters.

        Workers keep their own running totals; counters only go up, so this adds the increase
        since the last call, and sets the last-frame age. Safe from any thread. Ignored for
        unknown sources (a late call racing the stream's removal must not recreate series).
        """
        with self._lock:
            totals = self._totals.get(source_id)
            if totals is None:
                return
            increments = (
                (self.frames_decoded, status.frames_decoded - totals.decoded),
                (self.frames_dropped, status.frames_dropped - totals.dropped),
                (self.source_reconnects, status.reconnects - totals.reconnects),
                (self.decode_errors, status.decode_errors - totals.decode_errors),
                (self.frames_damaged, status.frames_damaged - totals.damaged),
                (self.frames_skipped, status.frames_skipped - totals.skipped),
            )
            totals.skipped = max(totals.skipped, status.frames_skipped)
            totals.decode_errors = max(totals.decode_errors, status.decode_errors)
            totals.damaged = max(totals.damaged, status.frames_damaged)
            totals.decoded = max(totals.decoded, status.frames_decoded)
            totals.dropped = max(totals.dropped, status.frames_dropped)
            totals.reconnects = max(totals.reconnects, status.reconnects)
            for counter, amount in increments:
                if amount > 0:
                    counter.labels(source_id).inc(amount)
            if status.decode_path is not None:
                path = (status.decode_path, status.decode_reason_label)
                if path != totals.decode_path:
                    if totals.decode_path is not None:
                        self.source_decode_path.remove(source_id, *totals.decode_path)
                    self.source_decode_path.labels(source_id, *path).set(1.0)
                    totals.decode_path = path
            if status.last_frame_time is not None:
                age = (time.time() if now is None else now) - status.last_frame_time
                self.source_last_frame_age.labels(source_id).set(max(0.0, age))

    def sync_event_snapshots(self, source_id: str, kept: int, skipped: int, failed: int) -> None:
        """Fold a stream's cumulative event snapshot counts into the counter (as sync_source
        does its frame counts). Ignored for unknown sources."""
        with self._lock:
            totals = self._totals.get(source_id)
            if totals is None:
                return
            now = (kept, skipped, failed)
            for outcome, count, last in zip(_SNAPSHOT_OUTCOMES, now, totals.snapshots, strict=True):
                if count > last:
                    self.event_snapshots.labels(source_id, outcome).inc(count - last)
            last_kept, last_skipped, last_failed = totals.snapshots
            totals.snapshots = (
                max(kept, last_kept),
                max(skipped, last_skipped),
                max(failed, last_failed),
            )

    def restart_source(self, source_id: str) -> None:
        """The source's worker was replaced: its next status counts from zero again, and the
        counters go on from where they are (they never go down)."""
        with self._lock:
            totals = self._totals.get(source_id)
            if totals is not None:
                totals.decoded = totals.dropped = totals.reconnects = 0
                totals.decode_errors = totals.damaged = totals.skipped = 0
                totals.snapshots = (0, 0, 0)

    def remove_source(self, source_id: str) -> None:
        """Drop every series labelled with a deleted source."""
        self.fold()  # its frames still pending are counted before its series go
        with self._lock:
            totals = self._totals.pop(source_id, None)
            if totals is not None and totals.series is not None:
                self._slots.pop(totals.series.slot, None)
            for metric in (
                self.stage_latency,
                self.end_to_end_latency,
                self.frames_decoded,
                self.frames_processed,
                self.frames_dropped,
                self.frames_skipped,
                self.source_reconnects,
                self.decode_errors,
                self.frames_damaged,
                self.source_state,
                self.source_last_frame_age,
                self.source_gpu,
                self.source_decode_path,
                self.event_snapshots,
                self.zone_objects,
                self.line_crossings,
                self.tracks_started,
            ):
                metric.remove_by_labels({"source": source_id})

    # --- GPU devices ------------------------------------------------------------------------

    def set_gpu_usage(self, gpu: str, *, streams: int, memory_bytes: int | None = None) -> None:
        """One GPU's stream count and allocator memory (refreshed before a scrape); the
        CPU ("cpu") has no GPU memory to report."""
        self.gpu_streams.labels(gpu).set(streams)
        if memory_bytes is not None:
            self.gpu_memory_used.labels(gpu).set(memory_bytes)

    # --- worker processes -------------------------------------------------------------------

    def set_worker_up(self, worker: str, gpu: str, up: bool) -> None:
        self.worker_up.labels(worker, gpu).set(1.0 if up else 0.0)

    def count_worker_restart(self, worker: str, gpu: str) -> None:
        self.worker_restarts.labels(worker, gpu).inc()

    # --- service ---------------------------------------------------------------------------

    def set_stream_count(self, count: int) -> None:
        self.streams.set(count)

    def set_backend(
        self,
        *,
        backend: str,
        device: str,
        model: str,
        precision: str,
        data_path: str = "cpu",
        selection: str = "",
    ) -> None:
        """What serves: `data_path` "gpu" (NVDEC, our kernels, CUDA graphs) or "cpu" (CPU
        decode, every frame through the detector); `selection` says why this backend."""
        self.backend.info(
            {
                "backend": backend,
                "device": device,
                "model": model,
                "precision": precision,
                "data_path": data_path,
                "selection": selection,
            }
        )

    def zone_counts(self, source_id: str) -> ZoneCounts:
        """A stream's zone occupancy now and its line crossings so far, by class: what
        `vdet_zone_objects` and `vdet_line_crossings_total` hold for it."""
        counts = ZoneCounts()
        for metric in self.zone_objects.collect():
            for sample in metric.samples:
                labels = sample.labels
                if labels.get("source") == source_id:
                    zone = counts.objects.setdefault(labels["zone"], {})
                    zone[labels["class"]] = int(sample.value)
        for metric in self.line_crossings.collect():
            for sample in metric.samples:
                labels = sample.labels
                if labels.get("source") == source_id and sample.name.endswith("_total"):
                    line = counts.crossings.setdefault(labels["zone"], {"in": {}, "out": {}})
                    line.setdefault(labels["direction"], {})[labels["class"]] = int(sample.value)
        return counts

    # --- API process -------------------------------------------------------------------------

    def observe_loop_lag(self, seconds: float) -> None:
        self.event_loop_lag.observe(seconds)

    def observe_clip(self, source_id: str, outcome: str, size: int) -> None:
        """An event clip written (`size` bytes) or not (the reason as outcome)."""
        self.clips.labels(source_id, outcome).inc()
        if size:
            self.clip_bytes.labels(source_id).inc(size)

    def count_lease_event(self, event: str) -> None:
        self.fleet_lease_events.labels(event).inc()

    def sync_fleet(
        self,
        *,
        nodes: int,
        leases: int,
        unowned: int,
        results: dict[str, int],
        lag: int = 0,
        notify_pending: int = 0,
    ) -> None:
        """The fleet's gauges, and the results counters from the running totals in
        `results` (outcome -> count so far)."""
        self.fleet_nodes.set(nodes)
        self.fleet_leases.set(leases)
        self.fleet_unowned.set(unowned)
        self.fleet_results_lag.set(lag)
        self.fleet_notify_pending.set(notify_pending)
        with self._lock:
            for outcome, total in results.items():
                delta = total - self._fleet_results_seen.get(outcome, 0)
                if delta > 0:
                    self.fleet_results.labels(outcome).inc(delta)
                    self._fleet_results_seen[outcome] = total

    def observe_gc_pause(self, generation: int, seconds: float) -> None:
        self.gc_pause.labels(str(generation)).observe(seconds)

    def render(self) -> bytes:
        """The registry in Prometheus text format (content type: `CONTENT_TYPE`)."""
        return b"".join(self.render_pieces())

    def render_pieces(self, samples_per_piece: int = 256) -> Iterator[bytes]:
        """`render()` in pieces of at most `samples_per_piece` samples, so that an event loop can
        write a scrape between its other work. At 96 streams a scrape is ~10k lines and takes
        0.1-0.2 s of Python; rendered whole on a thread, it held the GIL in 5 ms turns against
        the event loop, which gives the GIL away on every WebSocket send, and results reached
        clients up to 150 ms late during each scrape. A piece after a family's first leaves
        out its `# HELP`/`# TYPE` lines, so the joined text is one valid exposition.

        Samples are taken from each metric lazily, a piece at a time: collecting the per-stream
        stage histogram whole (7,680 samples at 96 streams) was itself a 50 ms stall.
        prometheus_client's `_created` companion samples are left out: each would be a gauge
        family of its own per piece, and nothing reads them (about one line in ten per stream).
        """
        for family, samples in _families(self.registry):
            first = True
            kept = (s for s in samples if not s.name.endswith("_created"))
            for chunk in _chunks(kept, samples_per_piece):
                piece = Metric(family.name, family.documentation, family.type, family.unit)
                piece.samples = chunk
                text = generate_latest(_Single(piece))
                if not first:  # the family's header went out with its first piece
                    text = text.split(b"\n", 2)[2]
                first = False
                yield text
            if first:  # a family with no samples still has its header
                yield generate_latest(_Single(family))


class _FoldFirst:
    """A collector with no metrics of its own, registered before every other: collecting the
    registry (a scrape, `get_sample_value`) folds pending frames first."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        self._metrics.fold()
        return []


def _fold_histograms(
    children: list[Any],
    row_group: np.ndarray[Any, np.dtype[np.intp]],
    groups: int,
    values: np.ndarray[Any, np.dtype[np.float64]],
) -> None:
    """Add each frame's `values[i]` to the Histogram child `children[row_group[i]]` as if it
    had been `observe()`d (a None child: the frame's source is gone). The children share
    their bucket bounds (LATENCY_BUCKETS_SECONDS), so the bucket of every frame and the
    counts of every child come from one `searchsorted` and one `bincount`."""
    bounds = np.array([*LATENCY_BUCKETS_SECONDS, float("inf")])
    size = len(bounds)
    # The first bound >= value, as observe() picks it; a NaN lands in the last (+Inf) bucket.
    bucket = np.minimum(np.searchsorted(bounds, values, side="left"), size - 1)
    counts = np.bincount(row_group * size + bucket, minlength=groups * size)
    sums = np.bincount(row_group, weights=values, minlength=groups).tolist()
    for group, (child, child_counts) in enumerate(
        zip(children, counts.reshape(groups, size).tolist(), strict=True)
    ):
        if child is None:
            continue
        buckets = getattr(child, "_buckets", None)
        total = getattr(child, "_sum", None)
        if (
            buckets is None
            or total is None
            or tuple(getattr(child, "_upper_bounds", ())) != tuple(bounds.tolist())
        ):
            for value in values[row_group == group].tolist():
                child.observe(value)  # not the prometheus_client this was written against
            continue
        for index, count in enumerate(child_counts):
            if count:
                buckets[index].inc(count)
        total.inc(sums[group])


def _families(registry: CollectorRegistry) -> Iterator[tuple[Metric, Iterator[Sample]]]:
    """Each metric family of `registry` (without samples) with its samples as a lazy iterator.

    prometheus_client's own metrics build every sample of a family at once in `collect()`;
    their `_samples()` yields them one child at a time. It is not public API: anything that
    does not have it (another collector, another version) is collected the public way.
    """
    collectors = getattr(registry, "_collector_to_names", None)
    if not isinstance(collectors, dict):
        for metric in registry.collect():
            yield _empty(metric), iter(metric.samples)
        return
    for collector in list(collectors):
        lazy = getattr(collector, "_samples", None)
        header = getattr(collector, "_get_metric", None)
        name = getattr(collector, "_name", None)
        if isinstance(collector, MetricWrapperBase) and lazy and header and name:
            family: Metric = header()
            yield family, (Sample(name + s[0], *s[1:]) for s in lazy())
            continue
        for metric in collector.collect():
            yield _empty(metric), iter(metric.samples)


def _empty(metric: Metric) -> Metric:
    return Metric(metric.name, metric.documentation, metric.type, metric.unit)


def _chunks(samples: Iterable[Sample], size: int) -> Iterator[list[Sample]]:
    chunk: list[Sample] = []
    for sample in samples:
        chunk.append(sample)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Single:
    """A collector of one collected metric (what `generate_latest` takes)."""

    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self._metric
