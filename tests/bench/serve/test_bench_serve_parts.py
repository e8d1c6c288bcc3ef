"""The measuring parts of `vdet bench serve` on their own: process tree, counters, nvidia-smi
output, latency summaries, which worker a kill picks and how a
kill is summarized."""

from __future__ import annotations

import os
import subprocess
import sys

from vdet.bench.serve import proctree
from vdet.bench.serve.events_client import latency_samples_ms, latency_summary_ms
from vdet.bench.serve.gpu_memory import parse_devices, parse_processes, parse_utilization
from vdet.bench.serve.kill import KillRecord, pick_worker, summarize
from vdet.bench.serve.results import ClientFigures, CloseEvent
from vdet.bench.serve.scrape import (
    StreamCounters,
    api_stalls,
    per_stream_counters,
    stream_counters,
)


def test_the_tree_holds_a_child_and_adds_up_its_cpu_and_memory() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        sample = proctree.sample_tree(os.getpid())
        assert sample.pids[0] == os.getpid() and child.pid in sample.pids
        assert sample.cpu_seconds > 0 and sample.rss_mib > 1
        assert sample.pss_mib is None or 0 < sample.pss_mib <= sample.rss_mib
        identity = dict(sample.identities)
        assert proctree.alive([(child.pid, identity[child.pid])]) == [child.pid]
        # A PID with another start time is another process (PID reuse): never ours to kill.
        assert proctree.alive([(child.pid, identity[child.pid] + 1)]) == []
    finally:
        child.kill()
        child.wait()
    assert proctree.alive([(child.pid, identity[child.pid])]) == []


def test_an_exited_root_gives_an_empty_sample() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert proctree.sample_tree(done.pid).pids == ()


METRICS = """\
# HELP vdet_frames_dropped_total Decoded frames skipped.
# TYPE vdet_frames_dropped_total counter
vdet_frames_dropped_total{source="n8-0"} 3.0
vdet_frames_dropped_total{source="n8-1",worker="1"} 2.0
vdet_frames_dropped_total{source="n16-0"} 100.0
vdet_frames_dropped_created{source="n8-0"} 1.7e9
# HELP vdet_frames_decoded_total Frames decoded.
# TYPE vdet_frames_decoded_total counter
vdet_frames_decoded_total{source="n8-0"} 300.0
vdet_frames_decoded_total{source="ctl-n8-0"} 30.0
# HELP vdet_frames_processed_total Frames processed.
# TYPE vdet_frames_processed_total counter
vdet_frames_processed_total{source="n8-0"} 297.0
"""


def test_counters_sum_the_prefixed_streams_over_every_label() -> None:
    counters = stream_counters(METRICS, "n8-")
    assert (counters.decoded, counters.processed, counters.dropped) == (300.0, 297.0, 5.0)
    assert stream_counters(METRICS, "none-").dropped == 0.0
    per_stream = per_stream_counters(METRICS, "n8-")
    assert per_stream == {
        "n8-0": StreamCounters(300.0, 297.0, 3.0),
        "n8-1": StreamCounters(0.0, 0.0, 2.0),
    }


def _stalls_text(lag: tuple[int, int, int], full: int) -> str:
    """Loop-lag counts in buckets <= 1 ms, <= 100 ms, above; `full` gen-2 pauses <= 100 ms."""
    fast, slow, huge = lag
    return f"""\
# TYPE vdet_api_event_loop_lag_seconds histogram
vdet_api_event_loop_lag_seconds_bucket{{le="0.001"}} {fast}.0
vdet_api_event_loop_lag_seconds_bucket{{le="0.1"}} {fast + slow}.0
vdet_api_event_loop_lag_seconds_bucket{{le="+Inf"}} {fast + slow + huge}.0
vdet_api_event_loop_lag_seconds_count {fast + slow + huge}.0
vdet_api_event_loop_lag_seconds_sum {0.0005 * fast + 0.05 * slow + 3 * huge}
# TYPE vdet_api_gc_pause_seconds histogram
vdet_api_gc_pause_seconds_bucket{{generation="2",le="0.001"}} 0.0
vdet_api_gc_pause_seconds_bucket{{generation="2",le="0.1"}} {full}.0
vdet_api_gc_pause_seconds_bucket{{generation="2",le="+Inf"}} {full}.0
vdet_api_gc_pause_seconds_count{{generation="2"}} {full}.0
vdet_api_gc_pause_seconds_sum{{generation="2"}} {0.08 * full}
"""


def test_api_stalls_are_read_as_bucket_bounds_over_a_window() -> None:
    before = api_stalls(_stalls_text((100, 0, 0), 1))
    after = api_stalls(_stalls_text((1090, 10, 0), 3))
    window = after.minus(before)
    assert window.loop_lag is not None and window.loop_lag.count == 1000
    assert window.loop_lag.quantile_bound_s(0.99) == 0.001
    assert window.loop_lag.max_bound_s() == 0.1
    assert window.gc_pauses["2"].count == 2 and window.gc_pauses["2"].max_bound_s() == 0.1
    stuck = api_stalls(_stalls_text((0, 0, 1), 0))
    assert stuck.loop_lag is not None and stuck.loop_lag.max_bound_s() == float("inf")
    assert api_stalls(METRICS).loop_lag is None  # a server without the histograms


def test_nvidia_smi_lines_are_read_and_the_tree_filters_processes() -> None:
    devices, used = parse_devices(
        "0, NVIDIA H200, 580.159.04, 1234\n1, NVIDIA H200, 580.159.04, 766\n"
    )
    assert devices == ("0: NVIDIA H200, driver 580.159.04", "1: NVIDIA H200, driver 580.159.04")
    assert used == 2000.0
    apps = "100, 500\n200, 700\n300, [N/A]\n"
    assert parse_processes(apps, [100, 300]) == 500.0
    assert parse_devices("") == ((), 0.0)
    # utilization.gpu, utilization.decoder per device: their means; what does not parse is left.
    assert parse_utilization("97, 100\n51, 40\n[N/A], [N/A]\n") == (74.0, 70.0)
    assert parse_utilization("") is None


def test_latency_summary_and_cdf_samples() -> None:
    assert latency_summary_ms([]) is None
    summary = latency_summary_ms([0.001 * i for i in range(1, 101)])
    assert summary is not None
    assert summary["n"] == 100 and summary["max"] == 100.0 and 50 <= summary["p50"] <= 51
    kept = latency_samples_ms([0.001 * i for i in range(5000, 0, -1)], 100)
    assert len(kept) == 100 and kept[0] == 1.0 and kept[-1] == 5000.0 and kept == sorted(kept)


WORKERS = [
    {"name": "w0", "role": "worker", "alive": True, "pid": 10, "streams": 1},
    {"name": "w1", "role": "worker", "alive": True, "pid": 11, "streams": 2},
    {"name": "w2", "role": "worker", "alive": False, "pid": None, "streams": 3},
    {"name": "spare0", "role": "spare", "alive": True, "pid": 12, "streams": 0},
]
STREAMS = [
    {"id": "n6-0", "worker": "w0"},
    {"id": "n6-1", "worker": "w1"},
    {"id": "n6-2", "worker": "w1"},
    {"id": "n6-3", "worker": "w2"},
    {"id": "ctl-n6-0", "worker": "w0"},
]
IDS = [f"n6-{i}" for i in range(4)]


def test_the_live_worker_with_most_measured_streams_is_killed() -> None:
    picked = pick_worker(WORKERS, STREAMS, IDS)
    assert not isinstance(picked, str)
    worker, streams = picked
    assert worker["name"] == "w1" and streams == ["n6-1", "n6-2"]
    # Only the control loop's stream on w0: never a reason to pick it.
    assert pick_worker(WORKERS[:1], STREAMS[-1:], IDS) == (
        "no live worker runs a stream of this step: nothing killed"
    )
    assert "no worker processes" in str(pick_worker([], STREAMS, IDS))


def _client_closed_at(t_s: float | None) -> ClientFigures:
    closes = [CloseEvent(t_s=t_s, code=1013, reason="", event="lagging")] if t_s else []
    return ClientFigures(
        window_s=10.0,
        results=1,
        results_per_s=0.1,
        streams_seen=1,
        slowest_stream_results_per_s=0.1,
        other_results=0,
        latency_ms=None,
        server_latency_ms=None,
        latency_samples_ms=[],
        dropped_frame_index_gaps=0,
        missed_seq_gaps=0,
        out_of_order=0,
        gap_events=0,
        closes=closes,
        closes_total=len(closes),
        cpu_percent=None,
    )


def test_a_kill_is_summarized_from_every_client_and_the_server_counters() -> None:
    start = 1000.0
    record = KillRecord("w1", 11, start + 2.0, ("n6-1", "n6-2"), {"n6-1": 0.1, "n6-2": 0.3})
    per_client = [
        {
            "n6-0": {"index_gaps": 2, "max_gap_s": 0.2, "returned": start + 2.01},
            "n6-1": {"index_gaps": 0, "max_gap_s": 1.5, "returned": start + 2.5},
            "n6-2": {"index_gaps": 0, "max_gap_s": 1.9, "returned": start + 2.9},
        },
        {
            "n6-0": {"index_gaps": 1, "max_gap_s": 0.4, "returned": start + 2.02},
            "n6-1": {"index_gaps": 0, "max_gap_s": 1.5, "returned": start + 3.0},
            "n6-2": {"index_gaps": 0, "max_gap_s": 1.9, "returned": None},
        },
    ]
    before = {i: StreamCounters(10, 10, 1) for i in IDS}
    after = {**before, "n6-0": StreamCounters(40, 37, 4), "n6-2": StreamCounters(20, 15, 6)}
    out = summarize(
        record,
        IDS,
        (start, start + 10.0),
        [_client_closed_at(None), _client_closed_at(1.0)],
        per_client,
        (before, after),
    )
    assert out.t_s == 2.0 and out.killed_streams == ["n6-1", "n6-2"] and out.other_streams == 2
    # n6-3 (another worker's) never reached a client: silent for the whole window.
    assert out.others_missing == 2 and out.others_max_gap_ms == 10000.0
    assert (out.others_server_dropped, out.killed_server_dropped) == (3.0, 5.0)
    assert out.server_dropped_per_stream == {"n6-0": 3.0, "n6-2": 5.0}
    assert out.failed_after_s == 0.3 and out.failed_seen == 2
    # n6-2 never came back at the second client: not published again (at every client).
    assert out.republished == 1 and out.republished_s_max is None
    assert out.republished_s_median == 1.0
    assert out.clients_connected  # the only close came before the kill
    nothing = summarize(KillRecord(error="why"), IDS, (start, start + 10.0), [], [], None)
    assert nothing.worker is None and nothing.error == "why" and nothing.others_missing is None
