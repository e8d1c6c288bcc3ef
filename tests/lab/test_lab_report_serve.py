"""bench/report.py on `vdet bench serve` results: tables, ratios, the shards of older result
files, missing fields."""

from __future__ import annotations

from typing import Any

import pytest
from support.lab import load_script

from vdet.bench.serve.results import ServeBenchResult

report = load_script("report.py")
DASH, render_markdown, result_kind = report.DASH, report.render_markdown, report.result_kind
as_streams_runs = report.as_streams_runs


def _latency(p50: float, p99: float) -> dict[str, float]:
    return {"p50": p50, "p90": p99, "p99": p99, "max": p99, "mean": p50, "n": 100}


def _client(rate: float, p99: float) -> dict[str, Any]:
    return {
        "window_s": 10.0,
        "results": int(rate * 10),
        "results_per_s": rate,
        "streams_seen": 8,
        "slowest_stream_results_per_s": rate / 8,
        "other_results": 3,
        "latency_ms": _latency(5.0, p99),
        "server_latency_ms": _latency(4.0, p99 - 1),
        "latency_samples_ms": [1.0, 5.0, p99],
        "dropped_frame_index_gaps": 0,
        "missed_seq_gaps": 0,
        "out_of_order": 0,
        "gap_events": 0,
        "closes": [{"t_s": 1.5, "code": 1013, "reason": "", "event": "lagging"}],
        "closes_total": 1,
        "cpu_percent": 12.0,
    }


def _step(n: int, rate: float) -> dict[str, Any]:
    return {
        "streams": n,
        "added": n,
        "add_seconds": 0.5,
        "all_publishing": True,
        "expected_results_per_s": 30.0 * n,
        "window_s": 10.0,
        "results_per_s": rate,
        "latency_ms": _latency(5.0, 9.5),
        "dropped": 0,
        "server_dropped": 0.0,
        "missed": 0,
        "cutoffs": 1,
        "real_time": False,
        "clients": [_client(rate, 9.5)],
        "control": {
            "get_detections_ms": _latency(2.0, 4.0),
            "post_ms": _latency(20.0, 40.0),
            "delete_ms": None,
            "errors": {"post HTTP 409": 1},
        },
        "server": {
            "processes": 9,
            "cpu_percent": 400.0,
            "cpu_percent_per_stream": 50.0,
            "rss_mib": 4000.0,
            "pss_mib": 3000.0,
            "memory_mib_per_stream": 80.0,
        },
        "gpu": {"used_mib": 9000.0, "used_mib_per_stream": 6.0, "server_processes_mib": 0.0},
        "counters": {"decoded": 2400.0, "processed": 2400.0, "dropped": 0.0},
        "bench_client": {
            "clients_cpu_percent_max": 12.0,
            "control_cpu_percent": 3.0,
            "client_bound": False,
        },
        "remove_seconds": 0.3,
        "api_stalls": {
            "loop_lag_samples": 200,
            "loop_lag_p99_ms": 7.5,
            "loop_lag_max_ms": 150.0,
            "loop_lag_mean_ms": 0.4,
            "gc": {
                "0": {"count": 900, "total_ms": 90.0, "max_ms": 1.0},
                "2": {"count": 3, "total_ms": 300.0, "max_ms": 150.0},
            },
        },
        "error": None,
    }


def _variant(name: str, env: dict[str, str], rates: dict[int, float]) -> dict[str, Any]:
    return {
        "name": name,
        "settings": {},
        "environment": env,
        "inherited_vdet_environment": {},
        "command": ["vdet", "serve"],
        "config": {"port": 8000},
        "ready_seconds": 3.2,
        "baseline_memory_mib": 500.0,
        "baseline_gpu_used_mib": 1000.0,
        "steps": [_step(n, rate) for n, rate in rates.items()],
        "exit": {"exit_code": 0, "signal_sent": "SIGTERM", "stop_seconds": 1.2, "orphans": []},
        "error": None,
    }


def serve_result() -> dict[str, Any]:
    return {
        "benchmark": "serve",
        "schema_version": 1,
        "date": "2026-12-03T12:00:00+00:00",
        "vdet_version": "0.1.0",
        "vdet_commit": "abc123",
        "machine": {
            "host_cpu": "Test CPU",
            "cpu_count": 16,
            "load_average_1m": 0.5,
            "gpus": ["0: NVIDIA H200, driver 580"],
            "platform": "Linux",
            "python": "3.11",
        },
        "packages": {"vdet": "0.1.0"},
        "options": {
            "streams": [8, 16],
            "duration_s": 10.0,
            "warmup_s": 3.0,
            "clients": 1,
            "control_interval_s": 0.25,
            "backend": "torch",
            "model": None,
            "clip": {
                "path": "sample.mp4",
                "width": 1920,
                "height": 1080,
                "fps": 30.0,
                "codec": "h264",
            },
        },
        "variants": [
            _variant("one-process", {}, {8: 240.0, 16: 300.0}),
            _variant("workers8", {"VDET_WORKERS__PER_GPU": "8"}, {8: 240.0, 16: 480.0}),
        ],
        "shards": {
            "command": ["python", "bench/gpu/streams.py"],
            "returncode": 0,
            "seconds": 60.0,
            "runs": [
                {
                    "name": "vdet paced 8 b1 x8proc mps",
                    "system": "vdet",
                    "sources": 8,
                    "paced": True,
                    "processes": 8,
                    "mps": True,
                    "fps_aggregate": 240.0,
                    "dropped": 0,
                    "latency_ms": {"p50": 4.0, "p99": 8.0},
                },
                {"name": "vdet paced 16 b1 x8proc mps", "sources": 16, "error": "boom\nlast"},
            ],
            "error": None,
        },
        "pipeline_baseline": {
            "frames": 30,
            "throughput_fps": 22.5,
            "latency_ms": {"inference": {"p50": 34.1, "p99": 60.0}},
            "backend": "onnxruntime",
            "load_average_1m": 0.5,
            "error": None,
        },
        "notes": ["a note"],
    }


def test_the_sample_follows_the_schema() -> None:
    """Today's schema; the sample's `shards` (bench/gpu/streams.py run beside the variants) is
    what result files from before 2026-12-07 carry, which the report still renders."""
    today = {k: v for k, v in serve_result().items() if k != "shards"}
    ServeBenchResult.model_validate(today)
    assert "variants" in ServeBenchResult.model_json_schema()["properties"]


def test_serve_results_are_recognised_and_rendered() -> None:
    data = serve_result()
    assert result_kind(data) == "serve"
    markdown = render_markdown(data, "serve-test")
    assert markdown is not None
    assert markdown.startswith("# Serve benchmark: serve-test\n")
    # results/s (expected), p50 / p99, dropped client / server, ratio to the first variant
    # at the same N, and to the shards harness where it has a run at that N.
    assert (
        "| one-process | 16 | 300.0 (480) | 5.0 / 9.5 | 0 / 0 | 0 | 1 (lagging) | no | 1.00 | — |"
        in markdown
    )
    assert "| workers8 | 16 | 480.0 (480) |" in markdown and "| 1.60 | — |" in markdown
    assert "| workers8 | 8 | 240.0 (240) |" in markdown and "| 1.00 | 1.00 |" in markdown
    assert "| workers8 | VDET_WORKERS__PER_GPU=8 | 3.2 | 0 (SIGTERM, 1.2 s) | none |" in markdown
    assert '{"post HTTP 409": 1}' in markdown
    assert "| vdet paced 16 b1 x8proc mps | 16 |" in markdown and "| last |" in markdown
    assert "0: NVIDIA H200, driver 580" in markdown
    assert "no service): 22.50 fps, inference p50 34.1 ms" in markdown
    # loop lag p99 / max, mean; GC count / longest by generation (none of generation 1)
    assert f"| one-process | 8 | 7.5 / 150.0 | 0.40 | 900 / 1.0 | {DASH} | 3 / 150.0 |" in markdown


KILL = {
    "worker": "w3",
    "pid": 4242,
    "t_s": 3.01,
    "killed_streams": [f"n16-{i}" for i in range(2)],
    "other_streams": 14,
    "others_missing": 0,
    "others_max_gap_ms": 41.5,
    "others_server_dropped": 0.0,
    "killed_server_dropped": 1.0,
    "server_dropped_per_stream": {"n16-1": 1.0},
    "failed_after_s": 0.052,
    "failed_seen": 2,
    "republished": 2,
    "republished_s_max": 1.234,
    "republished_s_median": 1.1,
    "clients_connected": True,
    "error": None,
}


def test_a_killed_worker_has_its_own_table() -> None:
    data = serve_result()
    assert "## A worker killed" not in (render_markdown(data, "no-kill") or "")
    data["variants"][1]["steps"][1]["kill"] = KILL
    data["variants"][0]["steps"][1]["kill"] = {
        **KILL,
        "worker": None,
        "pid": None,
        "t_s": None,
        "killed_streams": [],
        "error": "the server runs no worker processes (GET /v1/workers is empty): nothing",
    }
    data["options"] |= {"kill_worker_after_s": 3.0, "kill_worker_streams": [16]}
    ServeBenchResult.model_validate({k: v for k, v in data.items() if k != "shards"})
    markdown = render_markdown(data, "kill")
    assert markdown is not None and "## A worker killed mid-window" in markdown
    row = "| workers8 | 16 | w3 (2 of 16) | 3.0 | 0 / 0 | 42 | 0.05 | 1.23 / 1.10 | 2 of 2 | yes |"
    assert f"{row} {DASH} |" in markdown
    assert f"| one-process | 16 | {DASH} | {DASH} |" in markdown
    assert "| the server runs no worker processes" in markdown


def test_missing_fields_are_dashes_not_errors() -> None:
    data: dict[str, Any] = {
        "benchmark": "serve",
        "variants": [{"name": "broken", "error": "vdet serve exited with 2\nlog", "steps": [{}]}],
    }
    markdown = render_markdown(data, "sparse")
    assert markdown is not None
    assert f"| broken | (defaults) | {DASH} |" in markdown
    assert "## Errors" in markdown and "vdet serve exited with 2" in markdown


@pytest.mark.parametrize("shards", [True, False])
def test_steps_become_streams_runs_for_the_plots(shards: bool) -> None:
    data = serve_result()
    if not shards:
        data["shards"] = None
    runs = as_streams_runs(data)
    ours = [r for r in runs if r["system"] != "shards harness"]
    assert [(r["system"], r["sources"], r["fps_aggregate"]) for r in ours] == [
        ("one-process", 8, 240.0),
        ("one-process", 16, 300.0),
        ("workers8", 8, 240.0),
        ("workers8", 16, 480.0),
    ]
    assert ours[0]["latency_samples_ms"] == [1.0, 5.0, 9.5]
    assert len(runs) - len(ours) == (1 if shards else 0)  # the failed shard run is left out
