"""The server's own per-stream counters, read from its Prometheus /metrics.

They are the server's side of what the WebSocket clients see: frames decoded, processed and
dropped (decoded but skipped because detection was busy), summed over the streams whose id
starts with a prefix, or per stream (a killed worker's streams apart from the others).
Counters of a stream are removed with it, so a step is read before its streams are deleted.
Every series of a family counts, whatever other labels (a worker) it has.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "decoded": "vdet_frames_decoded",
    "processed": "vdet_frames_processed",
    "dropped": "vdet_frames_dropped",
}


@dataclass(frozen=True)
class StreamCounters:
    decoded: float
    processed: float
    dropped: float

    def minus(self, earlier: StreamCounters) -> StreamCounters:
        return StreamCounters(
            self.decoded - earlier.decoded,
            self.processed - earlier.processed,
            self.dropped - earlier.dropped,
        )

    @staticmethod
    def total(counters: Iterable[StreamCounters]) -> StreamCounters:
        items = list(counters)
        return StreamCounters(
            sum(c.decoded for c in items),
            sum(c.processed for c in items),
            sum(c.dropped for c in items),
        )


def per_stream_counters(text: str, prefix: str) -> dict[str, StreamCounters]:
    """The three counters of each source whose id starts with `prefix`."""
    totals: dict[str, dict[str, float]] = {}
    wanted = {family: key for key, family in COUNTERS.items()}
    for family in text_string_to_metric_families(text):
        key = wanted.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            source = sample.labels.get("source", "")
            if sample.name.endswith("_total") and source.startswith(prefix):
                counts = totals.setdefault(source, dict.fromkeys(COUNTERS, 0.0))
                counts[key] += sample.value
    return {source: StreamCounters(**counts) for source, counts in totals.items()}


def stream_counters(text: str, prefix: str) -> StreamCounters:
    """The three counters summed over the sources whose id starts with `prefix`."""
    return StreamCounters.total(per_stream_counters(text, prefix).values())
