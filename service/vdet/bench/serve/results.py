"""The result file of `vdet bench serve`: its schema, as pydantic models.

The runner builds these models and writes them as JSON (`"benchmark": "serve"`); tests
validate written files against them, and a checkout's bench/report.py renders them (tolerantly,
as dicts: older files too). Every latency is in milliseconds, every rate per
second of the measured window, every memory figure in MiB.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LatencyMs(_Model):
    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    n: int = Field(ge=1)


class CloseEvent(_Model):
    """The server closed a WebSocket client during the window (the client then resumed)."""

    t_s: float = Field(description="Seconds into the window.")
    code: int = Field(description="WebSocket close code (1013: lagging, 1001: shutdown).")
    reason: str
    event: str | None = Field(description="The end event sent before the close, if any.")


class SlowResult(_Model):
    """One of the slowest results of a window at a client."""

    t_s: float = Field(description="Seconds into the window when it was received.")
    source: str
    latency_ms: float = Field(description="Frame arrival -> received here.")
    server_ms: float = Field(description="Frame arrival -> published by the server.")
    worker: str | None = Field(
        default=None, description="The worker process running its stream, when there are some."
    )


class ClientFigures(_Model):
    """What one WebSocket client on /v1/events received in the window."""

    window_s: float
    results: int = Field(description="Results of the measured streams received.")
    results_per_s: float
    streams_seen: int
    slowest_stream_results_per_s: float | None
    other_results: int = Field(description="Results of other streams (the control loop's).")
    latency_ms: LatencyMs | None = Field(
        description="Frame arrival (server wall clock) -> received here (same host's clock)."
    )
    server_latency_ms: LatencyMs | None = Field(
        description="Frame arrival -> published by the server (its own `published_time`)."
    )
    latency_samples_ms: list[float] = Field(description="Evenly spaced quantiles, for plots.")
    latency_p99_per_s_ms: list[float | None] = Field(
        default_factory=list,
        description="p99 latency of the results received in each second of the window, in "
        "order: a steady tail and periodic stalls look alike in one p99, not here.",
    )
    loop_lag_max_per_s_ms: list[float] = Field(
        default_factory=list,
        description="This client's own event-loop lag, its maximum in each second of the window "
        "(probed every 5 ms): a late second here is the benchmark's, not the server's.",
    )
    slowest: list[SlowResult] = Field(
        default_factory=list, description="The window's slowest results here, slowest first."
    )
    dropped_frame_index_gaps: int = Field(description="Frames missing between results.")
    missed_seq_gaps: int = Field(description="Results this client never received (seq gaps).")
    out_of_order: int
    gap_events: int = Field(description="`gap` events: a resume found results already gone.")
    closes: list[CloseEvent]
    closes_total: int = Field(description="Closes since the client connected, all windows.")
    cpu_percent: float | None = Field(description="This client process's CPU, % of one core.")


class CallLatencies(_Model):
    """Round trips of the control calls made during the window, at the client."""

    get_detections_ms: LatencyMs | None
    post_ms: LatencyMs | None
    delete_ms: LatencyMs | None
    errors: dict[str, int] = Field(description="Failed calls by kind and status.")


class ServerUse(_Model):
    """The server's process tree over the window (CPU) and at its end (memory)."""

    processes: int
    cpu_percent: float = Field(description="CPU of the whole tree, % of one core.")
    api_cpu_percent: float | None = Field(
        default=None, description="CPU of the API process alone (all its threads), % of a core."
    )
    api_loop_cpu_percent: float | None = Field(
        default=None,
        description="CPU of the API process's main thread, which runs its event loop: near "
        "100 the loop is saturated, whatever its lag probe says.",
    )
    cpu_percent_per_stream: float
    worker_cpu_percent: dict[str, float] = Field(
        default_factory=dict,
        description="Each stream worker process's CPU (all its threads) over the window, % of "
        "a core, by its role and name (GET /v1/workers): a worker near 100 x its busy threads "
        "is the limit of its streams.",
    )
    rss_mib: float
    pss_mib: float | None = Field(description="Proportional set size: shared pages split.")
    memory_mib_per_stream: float = Field(
        description="(PSS, else RSS, at the end - before the first stream) / streams."
    )


class GpuUse(_Model):
    used_mib: float = Field(description="Used memory of every device at the window's end.")
    used_mib_per_stream: float = Field(description="(used - before the first stream) / streams.")
    server_processes_mib: float = Field(description="Listed for the server's PIDs (not MPS).")
    busy_percent: float | None = Field(
        default=None,
        description="Mean over the window of nvidia-smi's utilization.gpu (the share of time a "
        "kernel ran; not how full the SMs were), sampled every second, mean over devices.",
    )
    decoder_percent: float | None = Field(
        default=None, description="The same for utilization.decoder (NVDEC engines busy)."
    )


class ServerCounters(_Model):
    """The server's own counters of the measured streams over the window (/metrics)."""

    decoded: float
    processed: float
    dropped: float


class GcPauses(_Model):
    """The API process's garbage collections of one generation in the window."""

    count: int
    total_ms: float
    max_ms: float | None = Field(
        description="Upper bound of the highest histogram bucket hit (2000: 2 s or more)."
    )


class ApiStalls(_Model):
    """How long the API process stalled in the window, from its own /metrics histograms
    (vdet_api_event_loop_lag_seconds, vdet_api_gc_pause_seconds): bucket bounds, not exact."""

    loop_lag_samples: int = Field(description="Probe wake-ups (one per 50 ms when on time).")
    loop_lag_p99_ms: float | None = Field(
        description="Upper bound of the bucket holding the 99th percentile (2000: 2 s or more)."
    )
    loop_lag_max_ms: float | None = Field(description="Upper bound of the highest bucket hit.")
    loop_lag_mean_ms: float | None
    gc: dict[str, GcPauses] = Field(description="By generation: '0', '1', '2' (full).")


class BenchClientUse(_Model):
    """Whether the benchmark client itself could have limited the figures."""

    clients_cpu_percent_max: float | None = Field(description="The busiest client process.")
    control_cpu_percent: float = Field(description="The process running the control loop.")
    client_bound: bool = Field(description="A benchmark process was over 80% of a core.")


class WorkerKill(_Model):
    """One worker process killed with SIGKILL during the window, and what that cost.

    The other streams are those of the step not on the killed worker; the killed streams,
    those it ran. Gaps and returns are measured at every WebSocket client by receipt time;
    a killed stream has published again once a client received a result of a frame that
    arrived after the kill (`arrival_time`, the server's clock, the same host's)."""

    worker: str | None = Field(description="Its name (w0, ...); null: none was killed.")
    pid: int | None
    t_s: float | None = Field(description="Seconds into the window when it was killed.")
    killed_streams: list[str] = Field(description="The measured streams it ran.")
    other_streams: int = Field(description="Measured streams on the other workers.")
    others_missing: int | None = Field(
        description="The other streams' frame-index gaps in the window (the most any client "
        "saw, summed over streams): frames they dropped."
    )
    others_max_gap_ms: float | None = Field(
        description="The longest time without a result of one other stream at a client, "
        "window edges included."
    )
    others_server_dropped: float | None = Field(
        description="vdet_frames_dropped_total of the other streams over the window."
    )
    killed_server_dropped: float | None = Field(
        description="vdet_frames_dropped_total of the killed streams over the window."
    )
    server_dropped_per_stream: dict[str, float] = Field(
        default_factory=dict,
        description="vdet_frames_dropped_total over the window of each stream that dropped.",
    )
    failed_after_s: float | None = Field(
        description="Kill -> GET /v1/streams had shown every killed stream `failed`; null "
        "when some were never seen so (polled every 50 ms)."
    )
    failed_seen: int = Field(description="Killed streams seen `failed` in /v1/streams.")
    republished: int = Field(description="Killed streams that published again in the window.")
    republished_s_max: float | None = Field(
        description="Kill -> a killed stream's first new result at every client: the slowest "
        "stream; null unless every killed stream published again in the window."
    )
    republished_s_median: float | None = Field(
        description="The same, the median over the killed streams that published again."
    )
    clients_connected: bool = Field(
        description="No WebSocket client was closed by the server after the kill."
    )
    error: str | None = None


class ProcessTrend(_Model):
    """One process's memory over a step's window (--memory-every)."""

    role: str = Field(description="api, worker wN / spare spareN, child PID, client N, bench.")
    pid: int
    samples: int
    rss_start_mib: float
    rss_end_mib: float
    rss_slope_mib_per_min: float | None = Field(description="Least-squares slope of the RSS.")
    rss_late_slope_mib_per_min: float | None = Field(
        default=None,
        description="The same over the window's second half: growth that goes on after "
        "warm-up (caches and arenas filling) shows here, growth that settles does not.",
    )
    gpu_start_mib: float | None
    gpu_end_mib: float | None
    gpu_slope_mib_per_min: float | None
    gpu_late_slope_mib_per_min: float | None = None


class StepResult(_Model):
    """N streams on one server, measured for one window."""

    streams: int
    added: int
    add_seconds: float
    all_publishing: bool = Field(description="Every stream published before the warm-up.")
    expected_results_per_s: float | None = Field(
        description="streams x the clip's frame rate; None unpaced (as fast as it goes)."
    )
    window_s: float
    results_per_s: float | None = Field(description="The slowest client's rate.")
    latency_ms: LatencyMs | None = Field(description="The worst client's latency figures.")
    dropped: int | None = Field(description="Frame-index gaps (the most any client saw).")
    server_dropped: float | None = Field(description="vdet_frames_dropped_total in the window.")
    missed: int = Field(description="Results some client never received (seq gaps, summed).")
    cutoffs: int = Field(description="Server closes of clients in the window, summed.")
    real_time: bool = Field(
        description="results/s >= 97% of expected, nothing dropped or missed, no client cut off."
    )
    clients: list[ClientFigures]
    control: CallLatencies
    server: ServerUse | None
    gpu: GpuUse | None
    counters: ServerCounters | None
    bench_client: BenchClientUse
    remove_seconds: float
    decode_paths: dict[str, int] | None = Field(
        default=None,
        description="How many of the step's streams decoded on each path (nvdec, cpu) at the "
        "window's end, from their status; null when the server did not say.",
    )
    kill: WorkerKill | None = Field(
        default=None, description="A worker killed in this window (--kill-worker-after)."
    )
    memory_trend: list[ProcessTrend] | None = Field(
        default=None,
        description="Each process's RSS and GPU memory over the window and their slopes "
        "(--memory-every); null when not asked.",
    )
    api_stalls: ApiStalls | None = Field(
        default=None, description="None when the server exports no such histograms."
    )
    error: str | None = None


class ServerExitOut(_Model):
    exit_code: int | None
    signal_sent: str | None
    stop_seconds: float
    orphans: list[int] = Field(description="Processes of its tree alive after it exited.")


class Ceiling(_Model):
    """`--find-ceiling`: the largest step that held, and what stopped the next."""

    streams: int | None = Field(
        description="The largest stream count that was real time, dropped nothing and kept "
        "p99 within the bound; null: not even the first step."
    )
    stopped_at: int | None = Field(description="The step that failed; null: none did.")
    stopped_by: str | None = Field(description="Why that step failed.")
    step: int
    p99_limit_ms: float


class DecodeCeiling(_Model):
    """Decoding alone, no detection: the clip looped unpaced in parallel sessions for a while,
    the way `vdet serve`'s readers decode it (NVDEC where it takes the clip), in the same call
    as the serve steps."""

    decode_path: str = Field(description="nvdec or cpu, as the readers chose.")
    sessions: int
    processes: int
    seconds: float
    frames_per_s: float
    streams_equivalent: float | None = Field(
        description="frames_per_s over the clip's frame rate: how many cameras like it decode."
    )
    error: str | None = None


class VariantResult(_Model):
    name: str
    settings: dict[str, str] = Field(description="As given: dotted settings keys.")
    environment: dict[str, str] = Field(description="What the server got on top of ours.")
    inherited_vdet_environment: dict[str, str] = Field(
        description="VDET_* variables the server inherited from the benchmark's environment."
    )
    command: list[str]
    config: dict[str, Any] = Field(description="The YAML config file, as written.")
    ready_seconds: float | None
    baseline_memory_mib: float | None = Field(description="Tree PSS (else RSS), no streams.")
    baseline_gpu_used_mib: float | None
    steps: list[StepResult]
    ceiling: Ceiling | None = None
    exit: ServerExitOut | None
    error: str | None = None


class PipelineBaseline(_Model):
    """`vdet bench pipeline` on the same clip in the same run: one stream, no service."""

    frames: int
    throughput_fps: float | None = None
    latency_ms: dict[str, dict[str, float]] | None = Field(
        default=None, description="Per stage (decode, preprocess, inference, ...): p50, p99..."
    )
    backend: str | None = None
    load_average_1m: float | None = None
    error: str | None = None


class UltralyticsBaseline(_Model):
    """`vdet bench pipeline --baseline ultralytics` on the same clip in the same run:
    Ultralytics' default `predict` (ONNX Runtime, the same model) and vdet's pipeline
    alternating in blocks of frames, no service."""

    when: Literal["before", "after"]
    frames: int
    ultralytics_fps: float | None = None
    vdet_pipeline_fps: float | None = None
    boxes_matched: float | None = Field(
        default=None, description="Ultralytics' boxes vdet's pipeline found too (IoU >= 0.5)."
    )
    load_average_1m: float | None = None
    error: str | None = None


class ClipInfo(_Model):
    path: str
    width: int | None
    height: int | None
    fps: float | None
    codec: str | None


class Machine(_Model):
    host_cpu: str
    cpu_count: int | None
    load_average_1m: float = Field(description="At the start: other work moves every figure.")
    load_average_1m_end: float | None = None
    gpus: list[str] = Field(description="index: name, driver (nvidia-smi); empty without.")
    platform: str
    python: str


class RunOptions(_Model):
    streams: list[int]
    unpaced: bool = Field(
        default=False, description="Streams added with realtime false: as fast as detected."
    )
    duration_s: float
    warmup_s: float
    clients: int
    control_interval_s: float
    backend: str
    model: str | None
    clip: ClipInfo
    kill_worker_after_s: float | None = None
    kill_worker_streams: list[int] = Field(default_factory=list)
    find_ceiling: bool = False
    p99_limit_ms: float | None = None


class ServeBenchResult(_Model):
    benchmark: Literal["serve"] = "serve"
    schema_version: int = SCHEMA_VERSION
    date: str
    vdet_version: str | None
    vdet_commit: str | None = Field(description="git HEAD of the checkout, '+dirty' if edited.")
    machine: Machine
    packages: dict[str, str]
    options: RunOptions
    variants: list[VariantResult]
    pipeline_baseline: PipelineBaseline | None = None
    decode_ceiling: DecodeCeiling | None = None
    ultralytics_baselines: list[UltralyticsBaseline] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
