"""The server's own per-stream counters, read from its Prometheus /metrics.

They are the server's side of what the WebSocket clients see: frames decoded, processed and
dropped (decoded but lost because detection was busy), summed over the streams whose id
starts with a prefix, or per stream (a killed worker's streams apart from the others).
Counters of a stream are removed with it, so a step is read before its streams are deleted.
Every series of a family counts, whatever other labels (a worker) it has.

Also the API process's own stalls (event-loop lag, garbage-collection pauses): histograms,
turned into counts and bucket bounds over a window.
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


LOOP_LAG = "vdet_api_event_loop_lag_seconds"
GC_PAUSE = "vdet_api_gc_pause_seconds"


@dataclass(frozen=True)
class Histogram:
    """One histogram's cumulative counts by upper bound (seconds, +Inf last) and its sum."""

    buckets: tuple[tuple[float, float], ...]
    total_s: float

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def minus(self, earlier: Histogram) -> Histogram:
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
            self.total_s - earlier.total_s,
        )

    def quantile_bound_s(self, q: float) -> float | None:
        """The upper bound of the bucket holding quantile `q` (inf: above the last bound);
        None when empty. A histogram knows no closer than its buckets."""
        if self.count <= 0:
            return None
        wanted = q * self.count
        return next(le for le, n in self.buckets if n >= wanted)

    def max_bound_s(self) -> float | None:
        """The upper bound of the highest bucket with anything in it; None when empty."""
        return self.quantile_bound_s(1.0)


@dataclass(frozen=True)
class ApiStalls:
    """The API process's event-loop lag and its garbage-collection pauses by generation."""

    loop_lag: Histogram | None
    gc_pauses: dict[str, Histogram]

    def minus(self, earlier: ApiStalls) -> ApiStalls:
        lag = None
        if self.loop_lag is not None and earlier.loop_lag is not None:
            lag = self.loop_lag.minus(earlier.loop_lag)
        pauses = {
            gen: h.minus(earlier.gc_pauses[gen]) if gen in earlier.gc_pauses else h
            for gen, h in self.gc_pauses.items()
        }
        return ApiStalls(lag, pauses)


def api_stalls(text: str) -> ApiStalls:
    """The two histograms of the API process (absent from servers older than them: None, {})."""
    buckets: dict[tuple[str, str], dict[float, float]] = {}
    sums: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (LOOP_LAG, GC_PAUSE):
            continue
        for sample in family.samples:
            key = (family.name, sample.labels.get("generation", ""))
            if sample.name.endswith("_bucket"):
                buckets.setdefault(key, {})[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_sum"):
                sums[key] = sample.value

    def histogram(key: tuple[str, str]) -> Histogram:
        return Histogram(tuple(sorted(buckets[key].items())), sums.get(key, 0.0))

    lag = histogram((LOOP_LAG, "")) if (LOOP_LAG, "") in buckets else None
    pauses = {gen: histogram((name, gen)) for name, gen in buckets if name == GC_PAUSE}
    return ApiStalls(lag, pauses)
