"""The server's own per-stream counters, read from its Prometheus /metrics.

They are the server's side of what the WebSocket clients see: frames decoded, processed and
dropped (decoded but skipped because detection was busy), summed over the streams whose id
starts with a prefix. Counters of a stream are removed with it, so a step is read before its
streams are deleted. Every series of a family counts, whatever other labels (a worker) it has.
"""

from __future__ import annotations

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


def stream_counters(text: str, prefix: str) -> StreamCounters:
    """The three counters summed over the sources whose id starts with `prefix`."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    wanted = {family: key for key, family in COUNTERS.items()}
    for family in text_string_to_metric_families(text):
        key = wanted.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("source", "").startswith(
                prefix
            ):
                totals[key] += sample.value
    return StreamCounters(**totals)
