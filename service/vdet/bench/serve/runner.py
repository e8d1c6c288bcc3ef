"""One `vdet bench serve` run: every variant's server through every stream step.

Per variant: start the server, read its tree with no streams (the memory baseline), connect
the WebSocket clients, then for each N: add N streams, wait until each has published, warm
up, measure one window (clients, control loop, process tree, /metrics, GPU memory; with
--kill-worker-after, a worker killed mid-window beside them), collect, remove the streams.
The server is always stopped, whatever failed; a failed variant or step is recorded with its
reason and the run goes on. This module sequences; the measuring is done by the modules it
calls.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import multiprocessing
import multiprocessing.connection
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Literal

import httpx

from vdet.bench.environment import cpu_model
from vdet.bench.serve import control, gpu_memory, kill, memory_trend, proctree, scrape
from vdet.bench.serve.events_client import client_main
from vdet.bench.serve.options import ServeBenchOptions, Variant
from vdet.bench.serve.results import (
    ApiStalls,
    BenchClientUse,
    CallLatencies,
    Ceiling,
    ClientFigures,
    ClipInfo,
    GcPauses,
    GpuUse,
    LatencyMs,
    Machine,
    RunOptions,
    ServeBenchResult,
    ServerCounters,
    ServerExitOut,
    ServerUse,
    StepResult,
    UltralyticsBaseline,
    VariantResult,
    WorkerKill,
)
from vdet.bench.serve.server import ServeProcess, ServerStartError, free_port, vdet_executable
from vdet.core.assets import sample_clip

Progress = Callable[[str], None]

# Results name the clip and the server command as the user gave them, not by where they lie on
# the machine that ran them.
SAMPLE_CLIP_NAME = "sample.mp4 (shipped with vdet)"

REAL_TIME_FRACTION = 0.97
CLIENT_BOUND_PERCENT = 80.0
_CLIENT_START_TIMEOUT_S = 60.0
_COLLECT_TIMEOUT_S = 20.0
_WINDOW_LEAD_S = 0.3  # the window starts this long after it is announced to the clients
_WINDOW_GRACE_S = 0.3  # results received after the window are not counted: let it end first
_PACKAGES = ("vdet", "numpy", "onnxruntime", "av", "fastapi", "uvicorn", "websockets", "torch")


def _stderr(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def probe_clip(path: Path) -> ClipInfo:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate
        return ClipInfo(
            path=str(path),
            width=stream.width,
            height=stream.height,
            fps=float(rate) if rate else None,
            codec=stream.codec_context.name,
        )


def source_checkout() -> Path:
    """The repository root when vdet runs from a checkout (service/vdet/bench/serve/runner.py)."""
    return Path(__file__).resolve().parents[4]


def vdet_commit() -> str | None:
    """HEAD of the checkout vdet runs from, with '+dirty' when it has uncommitted changes."""
    root = source_checkout()
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine() -> Machine:
    cpu = cpu_model()
    gpus = gpu_memory.read_gpu_memory()
    return Machine(
        host_cpu=cpu,
        cpu_count=os.cpu_count(),
        load_average_1m=round(os.getloadavg()[0], 2),
        gpus=list(gpus.devices) if gpus else [],
        platform=platform.platform(),
        python=platform.python_version(),
    )


def packages() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def server_config(opts: ServeBenchOptions, port: int) -> dict[str, Any]:
    """The YAML config every variant starts from (its settings override it through env)."""
    config: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "backend": opts.backend,
        # N measured streams plus the control loop's extra one.
        "max_streams": min(1024, max(opts.streams) + 1),
        "log_level": "warning",
    }
    if opts.model is not None:
        config["model_path"] = str(opts.model.resolve())
    if opts.clip is not None:
        # The source policy allows only the bundled clip among local files: the given clip's
        # folder is allowed for the run.
        config["ingest"] = {"source_policy": {"file_roots": [str(opts.clip.resolve().parent)]}}
    return config


def _cpu_seconds(names: dict[int, str]) -> dict[int, float]:
    """CPU seconds of each named process still there."""
    found = {pid: proctree.process_cpu_seconds(pid) for pid in names}
    return {pid: cpu[0] for pid, cpu in found.items() if cpu is not None}


async def _sample_utilization(until: float) -> tuple[float, float] | None:
    """Mean (kernels busy %, decoders busy %) of the GPUs, sampled every second until the
    wall-clock time `until`; None without nvidia-smi."""
    samples = []
    while time.time() < until:
        sample = await asyncio.to_thread(gpu_memory.read_utilization)
        if sample is None:
            return None
        samples.append(sample)
        await asyncio.sleep(max(0.0, min(1.0, until - time.time())))
    if not samples:
        return None
    return (
        sum(s[0] for s in samples) / len(samples),
        sum(s[1] for s in samples) / len(samples),
    )


# --------------------------------------------------------------------------- client processes


@dataclass
class _Client:
    process: BaseProcess
    conn: multiprocessing.connection.Connection


async def _receive(conn: multiprocessing.connection.Connection, timeout_s: float) -> Any:
    if not await asyncio.to_thread(conn.poll, timeout_s):
        raise TimeoutError("no answer from a WebSocket client process")
    return conn.recv()


async def _start_clients(url: str, count: int) -> list[_Client]:
    ctx = multiprocessing.get_context("spawn")
    clients = []
    for _ in range(count):
        parent, child = ctx.Pipe(duplex=True)
        process = ctx.Process(target=client_main, args=(url, child), daemon=True)
        process.start()
        child.close()
        clients.append(_Client(process, parent))
    for client in clients:
        kind, detail = await _receive(client.conn, _CLIENT_START_TIMEOUT_S)
        if kind != "ready":
            raise RuntimeError(f"a WebSocket client could not connect to {url}: {detail}")
    return clients


def _stop_clients(clients: Sequence[_Client]) -> None:
    for client in clients:
        try:
            client.conn.send(("stop",))
        except OSError:
            continue
    for client in clients:
        client.process.join(5.0)
        if client.process.is_alive():
            client.process.kill()
            client.process.join(5.0)
        client.conn.close()


# --------------------------------------------------------------------------- one step


def _latency(values: list[float]) -> LatencyMs | None:
    from vdet.bench.serve.events_client import latency_summary_ms

    summary = latency_summary_ms(values)
    return LatencyMs.model_validate(summary) if summary else None


async def _metrics(
    http: httpx.AsyncClient, prefix: str
) -> tuple[dict[str, scrape.StreamCounters], scrape.ApiStalls] | None:
    try:
        response = await http.get("/metrics")
        response.raise_for_status()
        text = response.text
        return scrape.per_stream_counters(text, prefix), scrape.api_stalls(text)
    except (httpx.HTTPError, ValueError):
        return None


def _ms(seconds: float | None, h: scrape.Histogram) -> float | None:
    """Milliseconds of a bucket bound of `h`; its +Inf bucket reads as its last finite bound."""
    if seconds is None:
        return None
    finite = [le for le, _ in h.buckets if le != float("inf")]
    return round(min(seconds, finite[-1]) * 1000 if finite else seconds * 1000, 3)


def _api_stalls(before: scrape.ApiStalls, after: scrape.ApiStalls) -> ApiStalls | None:
    window = after.minus(before)
    lag = window.loop_lag
    if lag is None:
        return None
    gc_pauses = {
        gen: GcPauses(
            count=round(h.count),
            total_ms=round(h.total_s * 1000, 3),
            max_ms=_ms(h.max_bound_s(), h),
        )
        for gen, h in sorted(window.gc_pauses.items())
    }
    return ApiStalls(
        loop_lag_samples=round(lag.count),
        loop_lag_p99_ms=_ms(lag.quantile_bound_s(0.99), lag),
        loop_lag_max_ms=_ms(lag.max_bound_s(), lag),
        loop_lag_mean_ms=round(lag.total_s / lag.count * 1000, 3) if lag.count else None,
        gc=gc_pauses,
    )


def _worst(values: list[float | None], pick: Callable[[list[float]], float]) -> float | None:
    present = [v for v in values if v is not None]
    return pick(present) if present else None


def _worst_latency(clients: list[ClientFigures]) -> LatencyMs | None:
    present = [c.latency_ms for c in clients if c.latency_ms is not None]
    if not present:
        return None
    return LatencyMs(
        p50=max(x.p50 for x in present),
        p90=max(x.p90 for x in present),
        p99=max(x.p99 for x in present),
        max=max(x.max for x in present),
        mean=max(x.mean for x in present),
        n=min(x.n for x in present),
    )


@dataclass(frozen=True)
class _Baseline:
    memory_mib: float
    gpu_used_mib: float | None


async def _run_step(
    http: httpx.AsyncClient,
    server: ServeProcess,
    clients: list[_Client],
    n: int,
    opts: ServeBenchOptions,
    clip: ClipInfo,
    baseline: _Baseline,
) -> StepResult:
    prefix, extra_prefix = f"n{n}-", f"ctl-n{n}-"
    ids = [f"{prefix}{i}" for i in range(n)]
    setup = control.CallLog()
    started = time.monotonic()
    added = await control.add_streams(http, ids, clip.path, setup, realtime=not opts.unpaced)
    add_seconds = time.monotonic() - started
    # Unpaced, a stream goes as fast as it is detected: no rate to expect.
    expected = None if opts.unpaced else n * (clip.fps or 30.0)
    error = None
    if added < n:
        error = f"only {added} of {n} streams were added: {dict(setup.errors)}"
    publishing = error is None and await control.wait_publishing(http, ids, 60.0 + n)

    window_start = time.time() + opts.warmup_s + _WINDOW_LEAD_S
    window_end = window_start + opts.duration_s
    for client in clients:
        client.conn.send(("window", window_start, window_end, prefix))
    await asyncio.sleep(max(0.0, window_start - time.time()))
    # CPU only at the start: reading memory would stall the server inside the window.
    tree0, cpu0, t0 = server.note_tree(memory=False), time.process_time(), time.monotonic()
    api0 = proctree.process_cpu_seconds(server.pid)
    worker_names = await control.worker_pids(http)
    workers0 = _cpu_seconds(worker_names)
    scraped0 = await _metrics(http, prefix)
    utilization = asyncio.create_task(_sample_utilization(window_end))
    trend = None
    if opts.memory_every_s > 0:
        trend = asyncio.create_task(
            memory_trend.sample_window(
                server.pid,
                [c.process.pid for c in clients if c.process.pid is not None],
                worker_names,
                until=window_end,
                every_s=opts.memory_every_s,
            )
        )
    killing = None
    if opts.kill_worker_after_s is not None and n in opts.kill_worker_streams and error is None:

        def notify(killed_at: float) -> None:
            for client in clients:
                client.conn.send(("kill", killed_at))

        killing = asyncio.create_task(
            kill.kill_one_worker(
                http,
                ids,
                at=window_start + opts.kill_worker_after_s,
                until=window_end,
                server_tree=lambda: proctree.descendants(server.pid),
                notify=notify,
            )
        )
    calls = await control.control_loop(
        http,
        ids,
        extra_prefix,
        clip.path,
        opts.control_interval_s,
        until=window_end,
        mutate=not opts.unpaced,
    )
    await asyncio.sleep(max(0.0, window_end - time.time()))
    tree1, cpu1, t1 = server.note_tree(), time.process_time(), time.monotonic()
    api1 = proctree.process_cpu_seconds(server.pid)
    workers1 = _cpu_seconds(worker_names)
    busy = await utilization
    scraped1 = await _metrics(http, prefix)
    killed = await killing if killing is not None else None
    trends = await trend if trend is not None else None
    gpu = await asyncio.to_thread(gpu_memory.read_gpu_memory, tree1.pids)
    await asyncio.sleep(_WINDOW_GRACE_S)

    workers = await control.workers_of(http)
    decoded_on = await control.decode_paths(http, ids)
    figures, per_stream = [], []
    for client in clients:
        client.conn.send(("collect",))
        _, data = await _receive(client.conn, _COLLECT_TIMEOUT_S)
        per_stream.append(data.pop("per_stream", {}))
        for slow in data.get("slowest", []):
            slow["worker"] = workers.get(slow["source"])
        figures.append(ClientFigures.model_validate(data))
    kill_result = None
    if killed is not None:
        kill_result = kill.summarize(
            killed,
            ids,
            (window_start, window_end),
            figures,
            per_stream,
            (scraped0[0], scraped1[0]) if scraped0 is not None and scraped1 is not None else None,
        )

    teardown = control.CallLog()
    started = time.monotonic()
    await control.remove_streams(http, ids, teardown)
    remove_seconds = time.monotonic() - started

    seconds = max(t1 - t0, 1e-9)
    server_use = None
    if tree1.pids:
        cpu = (tree1.cpu_seconds - tree0.cpu_seconds) / seconds * 100
        memory = tree1.pss_mib if tree1.pss_mib is not None else tree1.rss_mib
        api = None if api0 is None or api1 is None else (api1[0] - api0[0], api1[1] - api0[1])
        server_use = ServerUse(
            processes=len(tree1.pids),
            cpu_percent=round(cpu, 1),
            api_cpu_percent=None if api is None else round(api[0] / seconds * 100, 1),
            api_loop_cpu_percent=None if api is None else round(api[1] / seconds * 100, 1),
            cpu_percent_per_stream=round(cpu / n, 2),
            worker_cpu_percent={
                worker_names[pid]: round((workers1[pid] - workers0[pid]) / seconds * 100, 1)
                for pid in sorted(workers0.keys() & workers1.keys(), key=worker_names.__getitem__)
            },
            rss_mib=round(tree1.rss_mib, 1),
            pss_mib=round(tree1.pss_mib, 1) if tree1.pss_mib is not None else None,
            memory_mib_per_stream=round((memory - baseline.memory_mib) / n, 2),
        )
    gpu_use = None
    if gpu is not None and baseline.gpu_used_mib is not None:
        gpu_use = GpuUse(
            used_mib=gpu.used_mib,
            used_mib_per_stream=round((gpu.used_mib - baseline.gpu_used_mib) / n, 2),
            server_processes_mib=gpu.processes_mib,
            busy_percent=None if busy is None else round(busy[0], 1),
            decoder_percent=None if busy is None else round(busy[1], 1),
        )
    counters = stalls = None
    if scraped0 is not None and scraped1 is not None:
        total = scrape.StreamCounters.total
        delta = total(scraped1[0].values()).minus(total(scraped0[0].values()))
        counters = ServerCounters(
            decoded=delta.decoded, processed=delta.processed, dropped=delta.dropped
        )
        stalls = _api_stalls(scraped0[1], scraped1[1])
    rate = _worst([c.results_per_s for c in figures], min)
    dropped = max((c.dropped_frame_index_gaps for c in figures), default=None)
    missed = sum(c.missed_seq_gaps for c in figures)
    cutoffs = sum(len(c.closes) for c in figures)
    control_cpu = (cpu1 - cpu0) / seconds * 100
    clients_cpu = _worst([c.cpu_percent for c in figures], max)
    bound = control_cpu > CLIENT_BOUND_PERCENT or (
        clients_cpu is not None and clients_cpu > CLIENT_BOUND_PERCENT
    )
    real_time = (
        error is None
        and expected is not None
        and rate is not None
        and rate >= REAL_TIME_FRACTION * expected
        and not dropped
        and not (counters and counters.dropped)
        and missed == 0
        and cutoffs == 0
    )
    return StepResult(
        streams=n,
        added=added,
        add_seconds=round(add_seconds, 3),
        all_publishing=publishing,
        expected_results_per_s=expected,
        window_s=round(seconds, 3),
        results_per_s=rate,
        latency_ms=_worst_latency(figures),
        dropped=dropped,
        server_dropped=counters.dropped if counters else None,
        missed=missed,
        cutoffs=cutoffs,
        real_time=real_time,
        clients=figures,
        control=CallLatencies(
            get_detections_ms=_latency(calls.seconds.get("get_detections", [])),
            post_ms=_latency(calls.seconds.get("post", [])),
            delete_ms=_latency(calls.seconds.get("delete", [])),
            errors=dict(calls.errors),
        ),
        server=server_use,
        gpu=gpu_use,
        counters=counters,
        bench_client=BenchClientUse(
            clients_cpu_percent_max=clients_cpu,
            control_cpu_percent=round(control_cpu, 1),
            client_bound=bound,
        ),
        remove_seconds=round(remove_seconds, 3),
        decode_paths=decoded_on or None,
        kill=kill_result,
        memory_trend=trends,
        api_stalls=stalls,
        error=error,
    )


# --------------------------------------------------------------------------- one variant


def _step_line(variant: str, step: StepResult) -> str:
    latency = step.latency_ms
    p = f"p50 {latency.p50:.1f} / p99 {latency.p99:.1f} ms" if latency else "no latency"
    rate = f"{step.results_per_s:.1f}" if step.results_per_s is not None else "-"
    expected = step.expected_results_per_s
    of = f" of {expected:.0f}" if expected is not None else " (unpaced)"
    return (
        f"{variant} N={step.streams}: {rate}{of} results/s, "
        f"{p}, dropped {step.dropped} (server {step.server_dropped}), cut off {step.cutoffs}"
        + _load_line(step)
        + (
            "; decoded on " + ", ".join(f"{k} {v}" for k, v in sorted(step.decode_paths.items()))
            if step.decode_paths
            else ""
        )
        + (f"; {_kill_line(step.kill)}" if step.kill is not None else "")
        + (f", ERROR {step.error}" if step.error else "")
    )


def _load_line(step: StepResult) -> str:
    """The API process's CPU and its event loop's, the busiest worker's, how busy the GPU
    and its decoders were, and the p99 of each second at the first client: where a tail
    comes from."""
    parts = []
    server = step.server
    if server is not None and server.api_cpu_percent is not None:
        parts.append(
            f"API process {server.api_cpu_percent:.0f}% (loop {server.api_loop_cpu_percent:.0f}%)"
        )
    if server is not None and server.worker_cpu_percent:
        cpu = server.worker_cpu_percent
        busiest = max(cpu, key=cpu.__getitem__)
        parts.append(f"workers {min(cpu.values()):.0f}-{cpu[busiest]:.0f}% ({busiest})")
    gpu = step.gpu
    if gpu is not None and gpu.busy_percent is not None:
        parts.append(f"GPU busy {gpu.busy_percent:.0f}% (NVDEC {gpu.decoder_percent:.0f}%)")
    if step.clients and step.clients[0].latency_p99_per_s_ms:
        per_s = " ".join(
            "-" if v is None else f"{v:.0f}" for v in step.clients[0].latency_p99_per_s_ms
        )
        parts.append(f"p99 per second [{per_s}] ms")
        parts.append(_slowest_line(step.clients[0]))
    return "; " + ", ".join(parts) if parts else ""


def _slowest_line(client: ClientFigures) -> str:
    """Where the first client's slowest results came from: by worker, with the client's own
    worst loop lag (a busy benchmark client reads late too)."""
    if not client.slowest:
        return "no slowest results"
    by_worker = Counter(slow.worker or "-" for slow in client.slowest)
    worst = client.slowest[0]
    lag = max(client.loop_lag_max_per_s_ms, default=0.0)
    return (
        f"slowest {len(client.slowest)} by worker {dict(by_worker.most_common(4))}, worst "
        f"{worst.latency_ms:.0f} ms (server {worst.server_ms:.0f}) at {worst.t_s:.2f} s on "
        f"{worst.source}; client loop lag max {lag:.0f} ms"
    )


def _kill_line(killed: WorkerKill) -> str:
    if killed.worker is None or killed.t_s is None:
        return f"no worker killed: {killed.error}"
    return (
        f"killed {killed.worker} ({len(killed.killed_streams)} streams) at {killed.t_s:.1f} s: "
        f"others missed {killed.others_missing} frames (server dropped "
        f"{killed.others_server_dropped}), longest gap {killed.others_max_gap_ms} ms; killed "
        f"streams failed after {killed.failed_after_s} s, {killed.republished} of "
        f"{len(killed.killed_streams)} published again, max {killed.republished_s_max} s; "
        f"clients connected: {killed.clients_connected}"
    )


def ceiling_failure(step: StepResult, p99_limit_ms: float) -> str | None:
    """Why a step does not hold (--find-ceiling), or None when it does: every stream
    publishing, real time, no frame dropped, p99 within the bound. A step that
    misses several of these names each, so the reader sees every reason at once."""
    if step.error:
        return step.error.splitlines()[0]
    reasons: list[str] = []
    if not step.all_publishing:
        reasons.append("not every stream published")
    if not step.real_time:
        reasons.append(
            f"{step.results_per_s} results/s, below real time ({step.expected_results_per_s})"
        )
    dropped = max(step.dropped or 0, round(step.server_dropped or 0))
    if dropped:
        reasons.append(f"{dropped} frames dropped")
    if step.latency_ms is None:
        reasons.append("no latency measured")
    elif step.latency_ms.p99 > p99_limit_ms:
        reasons.append(f"p99 {step.latency_ms.p99:g} ms over {p99_limit_ms:g} ms")
    return "; ".join(reasons) or None


def ceiling_of(steps: list[StepResult], opts: ServeBenchOptions) -> Ceiling:
    """The largest step that held before the first that did not."""
    held: int | None = None
    for step in steps:
        why = ceiling_failure(step, opts.p99_limit_ms)
        if why is not None:
            return Ceiling(
                streams=held,
                stopped_at=step.streams,
                stopped_by=why,
                step=opts.ceiling_step,
                p99_limit_ms=opts.p99_limit_ms,
            )
        held = step.streams
    return Ceiling(
        streams=held,
        stopped_at=None,
        stopped_by=None,
        step=opts.ceiling_step,
        p99_limit_ms=opts.p99_limit_ms,
    )


async def _variant_steps(
    server: ServeProcess,
    opts: ServeBenchOptions,
    clip: ClipInfo,
    baseline: _Baseline,
    progress: Progress,
    steps: list[StepResult],
) -> None:
    """Every step into `steps`, so that those done survive a later step's failure."""
    ws_url = server.base_url.replace("http://", "ws://", 1) + "/v1/events"
    headers = {}
    if "api_key" in server.variant.settings:
        headers["X-API-Key"] = server.variant.settings["api_key"]
        ws_url += f"?api_key={server.variant.settings['api_key']}"
    clients = await _start_clients(ws_url, opts.clients)
    try:
        async with httpx.AsyncClient(
            base_url=server.base_url, timeout=30.0, headers=headers
        ) as http:
            for n in opts.streams:
                progress(f"{server.variant.name}: {n} streams")
                step = await _run_step(http, server, clients, n, opts, clip, baseline)
                steps.append(step)
                progress(_step_line(server.variant.name, step))
                if server.popen is not None and server.popen.poll() is not None:
                    break
                if opts.find_ceiling and (why := ceiling_failure(step, opts.p99_limit_ms)):
                    progress(f"{server.variant.name}: {n} streams do not hold: {why}")
                    break
    finally:
        await asyncio.to_thread(_stop_clients, clients)


def run_variant(
    variant: Variant, opts: ServeBenchOptions, clip: ClipInfo, workdir: Path, progress: Progress
) -> VariantResult:
    """One server with `variant`'s settings through every step; always stopped."""
    server = ServeProcess(variant, server_config(opts, free_port()), workdir)
    inherited = {
        k: v for k, v in os.environ.items() if k.startswith("VDET_") and k != "VDET_CONFIG"
    }
    steps: list[StepResult] = []
    ready = None
    baseline: _Baseline | None = None
    error = None
    exit_out = None
    try:
        progress(f"{variant.name}: starting vdet serve ({' '.join(server.command())})")
        server.start()
        ready = round(server.wait_ready(opts.start_timeout_s), 2)
        tree = server.note_tree()
        gpu = gpu_memory.read_gpu_memory(tree.pids)
        baseline = _Baseline(
            tree.pss_mib if tree.pss_mib is not None else tree.rss_mib,
            gpu.used_mib if gpu else None,
        )
        asyncio.run(_variant_steps(server, opts, clip, baseline, progress, steps))
    except ServerStartError as exc:  # its message ends with the server's log
        error = str(exc)
    except Exception as exc:  # a variant's failure is a result; the run goes on
        error = f"{type(exc).__name__}: {exc}\nserver log:\n{server.log_tail()}"
    finally:
        if server.popen is not None:
            gone = server.stop(opts.stop_timeout_s)
            exit_out = ServerExitOut(
                exit_code=gone.exit_code,
                signal_sent=gone.signal_sent,
                stop_seconds=gone.stop_seconds,
                orphans=list(gone.orphans),
            )
            progress(
                f"{variant.name}: server stopped ({gone.signal_sent or 'had exited'}), exit "
                f"code {gone.exit_code}, {gone.stop_seconds:.1f} s"
                + (f", ORPHANS {list(gone.orphans)}" if gone.orphans else "")
            )
    if error:
        progress(f"{variant.name}: FAILED: {error.splitlines()[0]}")
    return VariantResult(
        name=variant.name,
        settings=dict(variant.settings),
        environment=variant.environment(),
        inherited_vdet_environment=inherited,
        command=server.command(as_shown=True),
        config={**server.config, **({"model_path": str(opts.model)} if opts.model else {})},
        ready_seconds=ready,
        baseline_memory_mib=round(baseline.memory_mib, 1) if baseline else None,
        baseline_gpu_used_mib=baseline.gpu_used_mib if baseline else None,
        steps=steps,
        ceiling=ceiling_of(steps, opts) if opts.find_ceiling else None,
        exit=exit_out,
        error=error,
    )


# --------------------------------------------------------------------------- the run


def run_serve_bench(opts: ServeBenchOptions, progress: Progress = _stderr) -> ServeBenchResult:
    """Every variant, with the baselines asked for; the whole result."""
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    at_start = machine()
    clip = probe_clip((opts.clip or sample_clip()).resolve())
    notes = [
        "latency: frame arrival (the server's time.time() when the frame's packet was read or "
        "released by pacing) -> WebSocket receipt (the client's time.time()); one host, one "
        "clock",
        "each WebSocket client runs in its own process; bench_client says whether any "
        f"benchmark process used more than {CLIENT_BOUND_PERCENT:.0f}% of a core",
    ]
    baseline = None
    if opts.pipeline_frames:
        from vdet.bench.serve.pipeline_baseline import run_pipeline_baseline

        progress(f"pipeline alone: {opts.pipeline_frames} frames of the clip")
        baseline = run_pipeline_baseline(
            vdet_executable(), Path(clip.path), opts.backend, opts.model, opts.pipeline_frames
        )
        progress(f"pipeline alone: {baseline.throughput_fps} fps {baseline.error or ''}")
    decode_ceiling = None
    if opts.decode_ceiling_s > 0:
        from vdet.bench.serve.decode_ceiling import measure_decode_ceiling

        progress(f"decode-only ceiling: the clip looped for {opts.decode_ceiling_s:g} s")
        # As many readers as the largest step has streams: NVDEC reaches its throughput only
        # with many sessions (on an H100, 16 gave 3,650 frames/s where 64 gave 5,300).
        decode_ceiling = measure_decode_ceiling(
            Path(clip.path),
            seconds=opts.decode_ceiling_s,
            fps=clip.fps,
            sessions=max(opts.streams),
        )
        progress(
            f"decode-only ceiling: {decode_ceiling.frames_per_s} frames/s "
            f"({decode_ceiling.decode_path}, {decode_ceiling.sessions} sessions) = "
            f"{decode_ceiling.streams_equivalent} streams {decode_ceiling.error or ''}"
        )
    ultralytics = []
    if opts.ultralytics:
        ultralytics.append(_ultralytics_baseline(opts, clip, "before", progress))
    variants = []
    with tempfile.TemporaryDirectory(prefix="vdet-bench-serve-") as tmp:
        for i, variant in enumerate(opts.variants):
            workdir = Path(tmp) / f"{i}-{variant.name}"
            variants.append(run_variant(variant, opts, clip, workdir, progress))
    if opts.ultralytics:
        ultralytics.append(_ultralytics_baseline(opts, clip, "after", progress))
    if any(s.bench_client.client_bound for v in variants for s in v.steps):
        notes.append("WARNING: a benchmark process was CPU-bound in some step: see bench_client")
    version = packages().get("vdet")
    return ServeBenchResult(
        date=started,
        vdet_version=version,
        vdet_commit=vdet_commit(),
        machine=at_start.model_copy(update={"load_average_1m_end": round(os.getloadavg()[0], 2)}),
        packages=packages(),
        options=RunOptions(
            streams=list(opts.streams),
            unpaced=opts.unpaced,
            duration_s=opts.duration_s,
            warmup_s=opts.warmup_s,
            clients=opts.clients,
            control_interval_s=opts.control_interval_s,
            backend=opts.backend,
            model=str(opts.model) if opts.model else None,
            clip=clip.model_copy(update={"path": str(opts.clip or SAMPLE_CLIP_NAME)}),
            kill_worker_after_s=opts.kill_worker_after_s,
            kill_worker_streams=list(opts.kill_worker_streams),
            find_ceiling=opts.find_ceiling,
            p99_limit_ms=opts.p99_limit_ms if opts.find_ceiling else None,
        ),
        variants=variants,
        pipeline_baseline=baseline,
        decode_ceiling=decode_ceiling,
        ultralytics_baselines=ultralytics,
        notes=notes,
    )


def _ultralytics_baseline(
    opts: ServeBenchOptions, clip: ClipInfo, when: Literal["before", "after"], progress: Progress
) -> UltralyticsBaseline:
    from vdet.bench.serve.ultralytics_baseline import run_ultralytics_baseline

    progress(f"Ultralytics predict {when} the variants: {opts.ultralytics_frames} frames")
    done = run_ultralytics_baseline(
        vdet_executable(), Path(clip.path), opts.model, opts.ultralytics_frames, when
    )
    progress(f"Ultralytics predict: {done.ultralytics_fps} fps {done.error or ''}")
    return done
