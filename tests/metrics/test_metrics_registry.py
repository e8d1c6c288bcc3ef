"""Metrics: every series is defined, per-source series come and go, counters follow totals."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vdet.core.types import DetectionResult, Detections, SourceState, SourceStatus, StageTimings
from vdet.metrics.registry import STAGES, Metrics


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, keyed by (name, sorted labels)."""
    text = metrics.render().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(metrics: Metrics) -> dict[str, str]:
    text = metrics.render().decode()
    # `_created` timestamps are prometheus_client's own companion series.
    return {
        f.name: f.type
        for f in text_string_to_metric_families(text)
        if not f.name.endswith("_created")
    }


def a_result(source: str = "cam", e2e: float = 0.02) -> DetectionResult:
    return DetectionResult(
        source_id=source,
        frame_index=0,
        pts_seconds=0.0,
        arrival_time=1.0,
        published_time=1.0 + e2e,
        image_size_wh=(8, 8),
        detections=Detections.empty(),
        timings=StageTimings(0.001, 0.002, 0.003, 0.004, e2e),
    )


def test_every_metric_is_exposed_with_its_type() -> None:
    metrics = Metrics()
    metrics.set_backend(backend="onnxruntime", device="cpu", model="m.onnx", precision="fp32")
    found = families(metrics)
    # The parser names counters without their _total suffix; the text format has no info
    # type, so the info metric reads as the gauge vdet_backend_info.
    assert found == {
        "vdet_stage_latency_seconds": "histogram",
        "vdet_end_to_end_latency_seconds": "histogram",
        "vdet_frames_decoded": "counter",
        "vdet_frames_processed": "counter",
        "vdet_frames_dropped": "counter",
        "vdet_frames_skipped": "counter",
        "vdet_source_reconnects": "counter",
        "vdet_decode_errors": "counter",
        "vdet_frames_damaged": "counter",
        "vdet_inference_eager_fallbacks": "counter",
        "vdet_source_state": "gauge",
        "vdet_source_last_frame_age_seconds": "gauge",
        "vdet_websocket_clients": "gauge",
        "vdet_streams": "gauge",
        "vdet_streams_file_write_failures": "counter",
        "vdet_event_snapshots": "counter",
        "vdet_clips": "counter",
        "vdet_clip_bytes": "counter",
        "vdet_clips_disk_bytes": "gauge",
        "vdet_live_viewers": "gauge",
        "vdet_live_encode_seconds": "histogram",
        "vdet_live_frames_sent": "counter",
        "vdet_webhook_deliveries": "counter",
        "vdet_webhook_retries": "counter",
        "vdet_webhook_delivery_seconds": "histogram",
        "vdet_webhook_pending": "gauge",
        "vdet_notify_results_missed": "counter",
        "vdet_mqtt_messages": "counter",
        "vdet_mqtt_connected": "gauge",
        "vdet_backend_info": "gauge",
        "vdet_gpu_memory_used_bytes": "gauge",
        "vdet_source_gpu": "gauge",
        "vdet_source_decode_path": "gauge",
        "vdet_gpu_streams": "gauge",
        "vdet_gpu_frames_processed": "counter",
        "vdet_worker_up": "gauge",
        "vdet_worker_restarts": "counter",
        "vdet_mps_active": "gauge",
        "vdet_zone_objects": "gauge",
        "vdet_line_crossings": "counter",
        "vdet_tracks_started": "counter",
        "vdet_api_event_loop_lag_seconds": "histogram",
        "vdet_api_gc_pause_seconds": "histogram",
        "vdet_fleet_nodes": "gauge",
        "vdet_fleet_leases_held": "gauge",
        "vdet_fleet_unowned_streams": "gauge",
        "vdet_fleet_lease_events": "counter",
        "vdet_fleet_results": "counter",
        "vdet_fleet_bus_ack_seconds": "histogram",
        "vdet_fleet_results_lag": "gauge",
        "vdet_fleet_notify_pending": "gauge",
    }
    info = samples(metrics)
    labels = (("backend", "onnxruntime"), ("data_path", "cpu"), ("device", "cpu"))
    key = (
        "vdet_backend_info",
        (*labels, ("model", "m.onnx"), ("precision", "fp32"), ("selection", "")),
    )
    assert info[key] == 1.0


def test_each_instance_has_its_own_registry() -> None:
    one, two = Metrics(), Metrics()
    one.streams.set(3)
    assert samples(one)[("vdet_streams", ())] == 3.0
    assert samples(two)[("vdet_streams", ())] == 0.0


def test_observe_result_records_stage_and_end_to_end_latency() -> None:
    metrics = Metrics()
    metrics.add_source("cam", SourceState.CONNECTING)
    metrics.observe_result(a_result(e2e=0.02))
    metrics.observe_result(a_result(e2e=0.5))
    s = samples(metrics)
    for stage in STAGES:
        labels = (("source", "cam"), ("stage", stage))
        assert s[("vdet_stage_latency_seconds_count", labels)] == 2.0
    assert s[("vdet_stage_latency_seconds_sum", (("source", "cam"), ("stage", "inference")))] == (
        0.006
    )
    e2e = (("source", "cam"),)
    assert s[("vdet_end_to_end_latency_seconds_count", e2e)] == 2.0
    le_30ms = (("le", "0.03"), ("source", "cam"))
    assert s[("vdet_end_to_end_latency_seconds_bucket", le_30ms)] == 1.0
    assert s[("vdet_frames_processed_total", e2e)] == 2.0


def test_buckets_span_one_millisecond_to_two_seconds() -> None:
    metrics = Metrics()
    metrics.add_source("cam", SourceState.CONNECTING)
    metrics.observe_result(a_result())
    bounds = sorted(
        float(dict(labels)["le"])
        for (name, labels), _ in samples(metrics).items()
        if name == "vdet_end_to_end_latency_seconds_bucket"
    )
    assert bounds[0] == 0.001
    assert bounds[-2] == 2.0
    assert bounds[-1] == float("inf")


def test_source_state_is_one_hot() -> None:
    metrics = Metrics()
    metrics.add_source("cam", SourceState.CONNECTING)
    metrics.set_source_state("cam", SourceState.STREAMING)
    s = samples(metrics)
    values = {
        dict(labels)["state"]: v for (name, labels), v in s.items() if name == "vdet_source_state"
    }
    assert values == {state.value: float(state is SourceState.STREAMING) for state in SourceState}


def test_sync_source_turns_totals_into_increments() -> None:
    metrics = Metrics()
    metrics.add_source("cam", SourceState.CONNECTING)
    status = SourceStatus(frames_decoded=10, frames_dropped=2, reconnects=1, last_frame_time=100.0)
    metrics.sync_source("cam", status, now=100.5)
    status.frames_decoded, status.frames_dropped, status.frames_skipped = 25, 3, 12
    metrics.sync_source("cam", status, now=101.0)
    metrics.sync_source("cam", status, now=101.0)  # no change, no increment
    s = samples(metrics)
    cam = (("source", "cam"),)
    assert s[("vdet_frames_decoded_total", cam)] == 25.0
    assert s[("vdet_frames_dropped_total", cam)] == 3.0
    assert s[("vdet_frames_skipped_total", cam)] == 12.0
    assert s[("vdet_source_reconnects_total", cam)] == 1.0
    assert s[("vdet_source_last_frame_age_seconds", cam)] == 1.0


def test_a_restarted_worker_counts_on_from_where_the_counters_are() -> None:
    # A stream re-added to a new worker process reports from zero again.
    metrics = Metrics()
    metrics.add_source("cam", SourceState.CONNECTING)
    before = SourceStatus(frames_decoded=50, decode_errors=3, frames_damaged=9, frames_skipped=20)
    metrics.sync_source("cam", before)
    metrics.restart_source("cam")
    after = SourceStatus(frames_decoded=10, decode_errors=1, frames_damaged=4, frames_skipped=5)
    metrics.sync_source("cam", after)
    s = samples(metrics)
    cam = (("source", "cam"),)
    assert s[("vdet_frames_decoded_total", cam)] == 60.0
    assert s[("vdet_decode_errors_total", cam)] == 4.0
    assert s[("vdet_frames_damaged_total", cam)] == 13.0
    assert s[("vdet_frames_skipped_total", cam)] == 25.0


def test_event_snapshot_counts_fold_into_the_counter_and_a_restart_counts_on() -> None:
    metrics = Metrics()
    metrics.add_source("cam", SourceState.CONNECTING)
    cam = {"source": "cam"}

    def total(outcome: str) -> float:
        value = metrics.registry.get_sample_value(
            "vdet_event_snapshots_total", {**cam, "outcome": outcome}
        )
        assert value is not None, "the series exist from the start, at zero"
        return value

    assert (total("kept"), total("skipped"), total("failed")) == (0.0, 0.0, 0.0)
    metrics.sync_event_snapshots("cam", kept=5, skipped=2, failed=0)
    metrics.sync_event_snapshots("cam", kept=7, skipped=2, failed=1)
    metrics.sync_event_snapshots("cam", kept=7, skipped=2, failed=1)  # no change
    assert (total("kept"), total("skipped"), total("failed")) == (7.0, 2.0, 1.0)
    metrics.restart_source("cam")  # a new worker process counts from zero
    metrics.sync_event_snapshots("cam", kept=3, skipped=0, failed=0)
    assert total("kept") == 10.0
    metrics.remove_source("cam")
    metrics.sync_event_snapshots("cam", kept=50, skipped=0, failed=0)  # late: ignored
    assert (
        metrics.registry.get_sample_value("vdet_event_snapshots_total", {**cam, "outcome": "kept"})
        is None
    )


def test_remove_source_drops_its_series_and_ignores_late_reports() -> None:
    metrics = Metrics()
    for source in ("cam", "other"):
        metrics.add_source(source, SourceState.CONNECTING)
        metrics.observe_result(a_result(source))
        metrics.sync_source(source, SourceStatus(frames_decoded=1, last_frame_time=0.0), now=1.0)
    metrics.remove_source("cam")
    # A worker thread reporting after the removal must not bring the series back.
    metrics.set_source_state("cam", SourceState.STOPPED)
    metrics.observe_result(a_result("cam"))
    metrics.sync_source("cam", SourceStatus(frames_decoded=5), now=2.0)
    sources = {dict(labels).get("source") for (_, labels) in samples(metrics)}
    assert "cam" not in sources
    assert "other" in sources


def test_sources_carry_the_gpu_worker_that_runs_them() -> None:
    metrics = Metrics()
    metrics.add_source("cam", SourceState.CONNECTING, gpu="1")
    metrics.set_gpu_usage("1", streams=1, memory_bytes=123)
    info = samples(metrics)
    assert info[("vdet_source_gpu", (("gpu", "1"), ("source", "cam")))] == 1.0
    assert info[("vdet_gpu_streams", (("gpu", "1"),))] == 1.0
    assert info[("vdet_gpu_memory_used_bytes", (("gpu", "1"),))] == 123.0
    metrics.remove_source("cam")
    assert ("vdet_source_gpu", (("gpu", "1"), ("source", "cam"))) not in samples(metrics)


def test_a_scrape_in_pieces_is_the_whole_exposition_without_created_samples() -> None:
    from prometheus_client import generate_latest

    metrics = Metrics()
    for i in range(40):
        metrics.add_source(f"cam{i}", SourceState.STREAMING)
        metrics.observe_result(a_result(f"cam{i}", e2e=0.001 * i))
    pieces = list(metrics.render_pieces(samples_per_piece=50))
    joined = b"".join(pieces).decode()
    whole = generate_latest(metrics.registry).decode()

    def kept(text: str) -> list[tuple[str, str, dict[str, float]]]:
        return [
            (
                f.name,
                f.type,
                {f"{s.name}{sorted(s.labels.items())}": s.value for s in f.samples},
            )
            for f in text_string_to_metric_families(text)
            if not f.name.endswith("_created")
        ]

    assert kept(joined) == kept(whole)  # same families, in order, headers once, same samples
    assert "_created" not in joined
    assert max(p.count(b"\n") for p in pieces) <= 50 + 2  # samples, and a header at most
    assert len(pieces) > 40 * 6 // 50


def test_folded_frames_match_one_observe_per_frame() -> None:
    """Frames wait and are folded into the histograms in bulk at collection: the exposition is
    the one per-frame `observe()` calls give, bucket bounds themselves included."""
    import numpy as np

    from vdet.metrics.registry import FOLD_AT, LATENCY_BUCKETS_SECONDS

    rng = np.random.default_rng(7)
    edges = [*LATENCY_BUCKETS_SECONDS, 0.0, 5.0]  # on a bound, below the first, past the last
    values = [*edges, *rng.uniform(0.0, 2.5, 300).tolist()]
    folded, observed = Metrics(), Metrics()
    for m in (folded, observed):
        for source in ("a", "b"):
            m.add_source(source, SourceState.STREAMING, gpu="0")
    for i, value in enumerate(values):
        source = "ab"[i % 2]
        result = a_result(source, e2e=value)
        folded.observe_result(result)
        stages = observed.stage_latency
        for stage, seconds in zip(STAGES, (0.001, 0.002, 0.003, 0.004), strict=True):
            stages.labels(source, stage).observe(seconds)
        observed.end_to_end_latency.labels(source).observe(value)
        observed.frames_processed.labels(source).inc()
        observed.gpu_frames_processed.labels("0").inc()
    assert len(values) < FOLD_AT  # all of them waited for the collection
    got, want = samples(folded), samples(observed)
    assert got.keys() == want.keys()
    for key, value in want.items():  # bucket counts exact; sums added in another order
        assert got[key] == pytest.approx(value, rel=1e-12), key


def test_pending_frames_are_folded_past_the_bound_without_a_scrape() -> None:
    from vdet.metrics.registry import FOLD_AT

    metrics = Metrics()
    metrics.add_source("cam", SourceState.STREAMING)
    for _ in range(FOLD_AT + 10):
        metrics.observe_result(a_result())
    assert len(metrics._pending) == 10
    assert metrics.registry.get_sample_value(
        "vdet_frames_processed_total", {"source": "cam"}
    ) == float(FOLD_AT + 10)
    assert not metrics._pending


def test_a_removed_source_s_pending_frames_go_nowhere_and_a_new_one_starts_at_zero() -> None:
    metrics = Metrics()
    metrics.add_source("cam", SourceState.STREAMING)
    metrics.add_source("other", SourceState.STREAMING)
    for _ in range(3):
        metrics.observe_result(a_result("cam"))
        metrics.observe_result(a_result("other"))
    metrics.remove_source("cam")
    metrics.add_source("cam", SourceState.STREAMING)
    metrics.observe_result(a_result("cam"))
    got = samples(metrics)
    assert got[("vdet_frames_processed_total", (("source", "cam"),))] == 1.0
    assert got[("vdet_frames_processed_total", (("source", "other"),))] == 3.0
    assert got[("vdet_end_to_end_latency_seconds_count", (("source", "cam"),))] == 1.0
