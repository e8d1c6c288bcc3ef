"""Many-stream benchmark on the GPU: the service's own stream manager on N 1080p30 H.264 sources.

Run on the GPU machine (bench/gpu/run_streams_device.sh does):
    python3 bench/gpu/streams.py --out $OUT/streams.json

Each run is N copies of the sample clip (1920x1080, 30 fps, H.264) added as looping file
streams to a `StreamManager` with a GPU device (vdet.gpu.devices: PyAV demux -> NVDEC ->
CUDA graph of our preprocess kernel, the demo YOLOv8n FP16 and our decode + NMS kernel ->
pinned host -> results hub), exactly as `vdet serve` runs them, either paced at real time like
cameras or unpaced (as fast as the decoders go; the mailbox drops what inference cannot take).
Measured over a window after warm-up: frames published per second, per-frame end-to-end latency
(packet release -> result published; `DetectionResult.timings.end_to_end`), frames dropped by
the mailboxes, GPU memory in use on the device (NVDEC surfaces included), process CPU and RSS.

Peers in the same run, on the same clip: `decode_only` (the same NVDEC readers, N sessions, no
inference: the ceiling of our ingest), `ultralytics` (PyAV decode + Ultralytics `predict` FP16
per frame, one stream), `cpu_decode` (vdet with FFmpeg CPU decode feeding the torch backend),
`cpu_backend` (vdet on ONNX Runtime CPU, the laptop path). `--stability-seconds S` adds a long
run that samples RSS and GPU memory over time.

Each run is a child process (`--run JSON`): one run's crash or CUDA fault cannot spoil the rest.
Output follows the schema bench/report.py reads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from vdet.bench.stats import percentiles
from vdet.cuda.host_wait import HOST_WAITS, HostWait

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "service" / "vdet" / "assets" / "demo.onnx"
SAMPLE = ROOT / "service" / "vdet" / "assets" / "sample.mp4"
LATENCY_SAMPLES_KEPT = 2000
_LAUNCH_STAGGER_S = 0.5  # between the processes of a run split over several


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _gpu_used_mib() -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def _latency_summary(values_s: list[float]) -> tuple[dict[str, float] | None, list[float] | None]:
    """p50/p95/p99/max/mean in ms (unrounded, as the result files have them), and at most
    LATENCY_SAMPLES_KEPT of the sorted samples for the CDF plot."""
    if not values_s:
        return None, None
    ms = np.asarray(values_s) * 1e3
    summary = {
        **percentiles(ms, (50, 95, 99)),
        "max": float(ms.max()),
        "mean": float(ms.mean()),
    }
    step = max(1, len(ms) // LATENCY_SAMPLES_KEPT)
    return summary, [round(float(v), 3) for v in np.sort(ms)[::step]]


class _Diagnostics:
    """Where a run's threads spend their wall time, and how long a thread waits for the GIL.

    Stack samples: every `period_s`, each thread's innermost Python frame (a thread inside a C
    call that released the GIL shows the line that called it: `Decode`, `synchronize`, `sleep`)
    and its innermost vdet frame, counted over the run. GIL wait: a probe thread sleeps 1 ms
    in a loop; how late it wakes is the OS timer's slack plus the wait for the GIL.
    """

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self._stop = threading.Event()
        self._leaf: dict[str, int] = {}
        self._ours: dict[str, int] = {}
        self._samples = 0
        self._late_us: list[float] = []
        self._threads = [
            threading.Thread(target=self._sample, name="diag-sampler", daemon=True),
            threading.Thread(target=self._probe, name="diag-gil-probe", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _sample(self) -> None:
        own = {t.ident for t in self._threads}
        marker = os.sep + "vdet" + os.sep
        while not self._stop.wait(self.period_s):
            for ident, frame in sys._current_frames().items():
                if ident in own:
                    continue
                code = frame.f_code
                leaf = f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}"
                self._leaf[leaf] = self._leaf.get(leaf, 0) + 1
                f: Any = frame
                while (
                    f is not None
                    and marker not in f.f_code.co_filename
                    and "/service/" not in (f.f_code.co_filename)
                ):
                    f = f.f_back
                if f is not None:
                    key = f"{Path(f.f_code.co_filename).name}:{f.f_lineno} {f.f_code.co_name}"
                    self._ours[key] = self._ours.get(key, 0) + 1
                self._samples += 1

    def _probe(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            time.sleep(0.001)
            self._late_us.append((time.perf_counter() - started - 0.001) * 1e6)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        for thread in self._threads:
            thread.join(2.0)

        def top(counts: dict[str, int]) -> list[tuple[str, float]]:
            total = max(1, sum(counts.values()))
            ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:25]
            return [(k, round(v / total, 4)) for k, v in ranked]

        late = np.asarray(self._late_us or [0.0])
        return {
            "thread_samples": self._samples,
            "innermost_frames": top(self._leaf),
            "innermost_vdet_frames": top(self._ours),
            "gil_probe_late_us": {
                **percentiles(late, (50, 99)),
                "mean": float(late.mean()),
                "n": int(late.size),
            },
        }


def _start_window(spec: dict[str, Any]) -> None:
    """Warm up; in a run of several processes, also wait until every process is warm and
    start the measured window at the time the orchestrator gives them all."""
    time.sleep(spec.get("warmup_s", 3.0))
    sync = spec.get("sync_dir")
    if not sync:
        return
    Path(sync, f"ready-{spec['rank']}").touch()
    go = Path(sync, "go")
    deadline = time.monotonic() + 120
    while not go.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the other processes of this run never got ready")
        time.sleep(0.05)
    start = float(go.read_text() or 0.0)
    time.sleep(max(0.0, start - time.time()))


def _host_wait(spec: dict[str, Any]) -> HostWait:
    """The run's host wait mode (GpuTuning.host_wait) (block when it names none)."""
    wanted = spec.get("host_wait") or "block"
    for mode in HOST_WAITS:
        if mode == wanted:
            return mode
    raise ValueError(f"host_wait must be one of {HOST_WAITS}, got {wanted!r}")


class _GpuSampler:
    """SM and NVDEC utilization read from NVML every `period_s` by the orchestrating process,
    so that one sampler covers a run split over several processes; `window` averages the
    samples of a run's measured window. NVML's figures are the share of the last sample
    period in which any kernel (any decode) was running, not how full the GPU was."""

    def __init__(self, period_s: float = 0.1) -> None:
        self.period_s = period_s
        self._samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as exc:  # no NVML: runs go on without utilization figures
            _progress(f"no GPU utilization sampling: {exc}")
            self._nvml = None
            return
        threading.Thread(target=self._sample, name="gpu-sampler", daemon=True).start()

    def _sample(self) -> None:
        nvml, handle = self._nvml, self._handle
        while not self._stop.wait(self.period_s):
            try:
                sm = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                dec = nvml.nvmlDeviceGetDecoderUtilization(handle)[0]
            except Exception:
                continue
            self._samples.append((time.time(), int(sm), int(dec)))

    def window(self, start: float | None, seconds: float | None) -> dict[str, float] | None:
        if start is None or seconds is None:
            return None
        inside = [s for s in list(self._samples) if start <= s[0] <= start + seconds]
        if not inside:
            return None
        return {
            "sm_busy_pct_mean": float(np.mean([s[1] for s in inside])),
            "nvdec_busy_pct_mean": float(np.mean([s[2] for s in inside])),
            "samples": len(inside),
        }

    def close(self) -> None:
        self._stop.set()


@contextlib.contextmanager
def _mps_daemon() -> Iterator[tuple[dict[str, str], Path]]:
    """An MPS control daemon of our own (private pipe and log folders) for one run: CUDA
    processes started with the yielded environment share one GPU context through it, so the
    kernels of several processes run concurrently instead of time-sliced."""
    import tempfile

    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise RuntimeError("nvidia-cuda-mps-control not found: MPS is not available here")
    base = Path(tempfile.mkdtemp(prefix="vdet-mps-"))
    (base / "pipe").mkdir()
    (base / "log").mkdir()
    env = dict(
        os.environ,
        CUDA_MPS_PIPE_DIRECTORY=str(base / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(base / "log"),
    )
    subprocess.run([control, "-d"], env=env, check=True, timeout=30)
    try:
        yield env, base / "log"
    finally:
        subprocess.run([control], input="quit\n", text=True, env=env, timeout=30, check=False)


def _mps_clients(log_dir: Path) -> int:
    """How many client processes the MPS server accepted (its control log says each)."""
    log = log_dir / "control.log"
    if not log.exists():
        return 0
    return sum("NEW CLIENT" in line.upper() for line in log.read_text().splitlines())


# ------------------------------------------------------------------------------ vdet itself


def _run_vdet(spec: dict[str, Any]) -> dict[str, Any]:
    from vdet.config.gpu import GpuSettings
    from vdet.config.streams import StreamSpec
    from vdet.core.assets import assets_dir
    from vdet.core.types import DetectionResult
    from vdet.inference.detector import Detector
    from vdet.metrics.registry import Metrics
    from vdet.results.hub import ResultsHub
    from vdet.streams.manager import StreamManager

    sources, paced = spec["sources"], spec["paced"]
    cpu_backend = spec["system"] == "cpu_backend"
    decoder: Literal["cpu", "nvdec"] = (
        "cpu" if spec["system"] in ("cpu_decode", "cpu_backend") else "nvdec"
    )
    detector = Detector.open(DEMO, "onnxruntime" if cpu_backend else "torch")
    pool = None
    if not cpu_backend:
        from vdet.gpu.devices import GpuTuning, build_gpu_pool
        from vdet.gpu.gil import shorten_gil_switch_interval

        shorten_gil_switch_interval()  # as vdet serve does with GPU devices
        settings = GpuSettings(decoder=decoder, batch=spec.get("batch") or 1)
        tuning = GpuTuning(
            ops="cuda",
            host_wait=_host_wait(spec),
            layer_kernels=spec.get("layer_kernels", True),
            frames_per_stream=spec.get("frames_per_stream", 2),
        )
        pool = build_gpu_pool(
            settings,
            detector.backend,
            input_shape=spec.get("input_shape", "rect"),
            tuning=tuning,
        )
    # The service's own replay buffers for the long run (its memory must not grow); room for
    # the whole window otherwise, so every frame's latency is read back.
    hub = (
        ResultsHub()
        if spec.get("stability")
        else ResultsHub(capacity_per_source=4096, capacity_total=1_000_000)
    )
    metrics = Metrics()
    manager = StreamManager(
        detector, detector.info.names, hub, metrics, max_streams=sources, gpu=pool
    )
    ids = [f"cam{i:03d}" for i in range(sources)]
    samples: list[dict[str, float]] = []
    try:
        for stream_id in ids:
            # The installed package's clip: the one file the default source policy allows.
            clip = assets_dir() / "sample.mp4"
            manager.add(StreamSpec(id=stream_id, url=str(clip), loop=True, realtime=paced))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(manager.get(i).frames_processed > 0 for i in ids):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("not every stream published a result within 60 s")
        _start_window(spec)

        def totals() -> tuple[int, int, int]:
            views = [manager.get(i) for i in ids]
            return (
                sum(v.status.frames_dropped for v in views),
                sum(v.status.frames_decoded for v in views),
                sum(v.frames_processed for v in views),
            )

        diagnostics = _Diagnostics() if spec.get("diagnose") else None
        if diagnostics is not None:
            diagnostics.start()
        dropped0, decoded0, processed0 = totals()
        seq0 = hub.last_seq
        cpu0, wall0 = _cpu_seconds(), time.monotonic()
        window_start = time.time()
        duration = spec["seconds"]
        sample_every = spec.get("sample_every_s", 0.0)
        next_sample = 0.0
        while (elapsed := time.monotonic() - wall0) < duration:
            if sample_every and elapsed >= next_sample:
                samples.append(
                    {
                        "t_s": round(elapsed, 1),
                        "rss_mib": _rss_mib(),
                        "gpu_memory_mib": _gpu_used_mib() or 0.0,
                    }
                )
                next_sample += sample_every
            time.sleep(min(0.2, max(0.0, duration - elapsed)))
        wall = time.monotonic() - wall0
        cpu = _cpu_seconds() - cpu0
        diagnosis = diagnostics.stop() if diagnostics is not None else None
        dropped1, decoded1, processed1 = totals()
        # In this process the hub keeps whole results (encoded ones come from worker processes).
        results = [
            r
            for r in hub.since(seq0)
            if isinstance(r, DetectionResult) and r.published_time >= window_start
        ]
        latencies = [r.timings.end_to_end for r in results]
        summary, kept = _latency_summary(latencies)
        if spec.get("sync_dir"):  # the orchestrator merges every process's latencies
            kept = [round(v * 1e3, 3) for v in latencies]
        eager = metrics.registry.get_sample_value("vdet_inference_eager_fallbacks_total")
        # Frames are counted by the streams themselves: a long run's hub keeps only its most
        # recent results (the service's own buffers), which then give the latencies.
        processed = processed1 - processed0
        run = {
            "window_start": window_start,
            "frames": processed,
            "latency_from_results": len(results),
            "duration_s": round(wall, 2),
            "fps_aggregate": processed / wall,
            "fps_per_source": processed / wall / sources,
            "decoded_fps": (decoded1 - decoded0) / wall,
            "dropped": dropped1 - dropped0,
            "drop_rate": (dropped1 - dropped0) / max(1, decoded1 - decoded0),
            "latency_ms": summary,
            "latency_samples_ms": kept,
            "gpu_memory_mib": _gpu_used_mib(),
            "cpu_percent": 100.0 * cpu / wall,
            "rss_mib": _rss_mib(),
            "eager_fallbacks": eager,
            "gpu_devices": pool.describe() if pool is not None else None,
        }
        if samples:
            run["samples"] = samples
        if diagnosis is not None:
            run["diagnosis"] = diagnosis
        return run
    finally:
        manager.close()
        if pool is not None:
            pool.close()
        detector.close()


# ---------------------------------------------------------------------------------- peers


def _reader_totals(readers: list[Any]) -> dict[str, float]:
    """What NVDEC readers did so far, summed: sessions created and the seconds that took,
    pacing schedule restarts and the media seconds they skipped (a window's are the change)."""
    decoders = [r.decoder for r in readers if r.decoder is not None]
    return {
        "nvdec_sessions": sum(d.sessions for d in decoders),
        "session_create_s": sum(d.session_create_seconds for d in decoders),
        "pacing_resets": sum(r.pacing_resets for r in readers),
        "pacing_lag_dropped_s": sum(r.pacing_lag_dropped_s for r in readers),
    }


def _run_decode_only(spec: dict[str, Any]) -> dict[str, Any]:
    from vdet.cuda.host_wait import set_host_wait
    from vdet.gpu.gil import shorten_gil_switch_interval
    from vdet.ingest.nvdec import GpuVideoFrame
    from vdet.ingest.nvdec_reader import NvdecSourceReader

    shorten_gil_switch_interval()
    set_host_wait(0, _host_wait(spec))
    sources, duration = spec["sources"], spec["seconds"]
    counts = [0] * sources
    decoding = [threading.Event() for _ in range(sources)]
    stop = threading.Event()
    counting = threading.Event()
    errors: list[str] = []

    readers: list[NvdecSourceReader] = []

    def decode(index: int) -> None:
        try:
            reader = NvdecSourceReader(
                str(SAMPLE), source_id=f"d{index}", loop=True, realtime=spec["paced"], strict=True
            )
            readers.append(reader)
            with reader:
                reader.open()
                for item in reader.frames():
                    if stop.is_set():
                        break
                    decoding[index].set()
                    if isinstance(item, GpuVideoFrame) and counting.is_set():
                        counts[index] += 1
        except Exception as exc:  # reported in the run
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=decode, args=(i,), daemon=True) for i in range(sources)]
    for thread in threads:
        thread.start()
    # As the vdet runs wait for every stream's first result: a window that opens while readers
    # still start up counts their start (paced readers then restart their schedules).
    deadline = time.monotonic() + 60
    for event in decoding:
        event.wait(max(0.0, deadline - time.monotonic()))
    _start_window(spec)
    diagnostics = _Diagnostics() if spec.get("diagnose") else None
    if diagnostics is not None:
        diagnostics.start()
    cpu0, wall0 = _cpu_seconds(), time.monotonic()
    window_start = time.time()
    readers0 = _reader_totals(readers)
    counting.set()
    time.sleep(duration)
    counting.clear()
    wall, cpu = time.monotonic() - wall0, _cpu_seconds() - cpu0
    reader_stats = {k: v - readers0[k] for k, v in _reader_totals(readers).items()}
    diagnosis = diagnostics.stop() if diagnostics is not None else None
    gpu_mib = _gpu_used_mib()
    stop.set()
    for thread in threads:
        thread.join(10)
    total = sum(counts)
    return {
        "window_start": window_start,
        "frames": total,
        "duration_s": round(wall, 2),
        "fps_aggregate": total / wall,
        "fps_per_source": total / wall / sources,
        "dropped": 0,
        "drop_rate": 0.0,
        "latency_ms": None,
        "latency_samples_ms": None,
        "gpu_memory_mib": gpu_mib,
        "cpu_percent": 100.0 * cpu / wall,
        "rss_mib": _rss_mib(),
        "errors": errors[:5],
        "readers": reader_stats,
        **({"diagnosis": diagnosis} if diagnosis is not None else {}),
    }


def _run_ultralytics(spec: dict[str, Any]) -> dict[str, Any]:
    """One paced stream: FFmpeg CPU decode (vdet's reader) -> Ultralytics predict per frame."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO  # type: ignore[attr-defined]

    from vdet.core.types import VideoFrame
    from vdet.ingest.reader import SourceReader

    model = YOLO("yolov8n.yaml")  # the demo's architecture (random weights; its NMS sees few boxes)
    kwargs: dict[str, Any] = {"half": True, "device": 0, "verbose": False}
    warm = np.zeros((1080, 1920, 3), np.uint8)
    for _ in range(5):
        model.predict(warm, **kwargs)
    latencies: list[float] = []
    frames = 0
    reader = SourceReader(str(SAMPLE), source_id="u", loop=True, realtime=spec["paced"])
    cpu0, wall0 = _cpu_seconds(), time.monotonic()
    warmup_end = wall0 + spec.get("warmup_s", 3.0)
    end = warmup_end + spec["seconds"]
    measured_from = None
    with reader:
        reader.open()
        for item in reader.frames():
            if not isinstance(item, VideoFrame):
                continue
            model.predict(item.image_bgr, **kwargs)
            now = time.monotonic()
            if now >= warmup_end:
                if measured_from is None:
                    measured_from = now
                    cpu0 = _cpu_seconds()
                latencies.append(time.time() - item.arrival_time)
                frames += 1
            if now >= end:
                break
    wall = time.monotonic() - (measured_from or wall0)
    summary, kept = _latency_summary(latencies)
    return {
        "frames": frames,
        "duration_s": round(wall, 2),
        "fps_aggregate": frames / wall,
        "fps_per_source": frames / wall,
        "dropped": 0,
        "drop_rate": 0.0,
        "latency_ms": summary,
        "latency_samples_ms": kept,
        "gpu_memory_mib": _gpu_used_mib(),
        "cpu_percent": 100.0 * (_cpu_seconds() - cpu0) / wall,
        "rss_mib": _rss_mib(),
        "notes": "Ultralytics predict FP16 on yolov8n.yaml (random init), every frame, "
        "frames decoded on the CPU by vdet's reader",
    }


RUNNERS = {
    "vdet": _run_vdet,
    "cpu_decode": _run_vdet,
    "cpu_backend": _run_vdet,
    "decode_only": _run_decode_only,
    "ultralytics": _run_ultralytics,
}


def _child(spec: dict[str, Any], out: Path) -> int:
    try:
        if spec.get("session_per_pass"):
            from vdet.ingest.nvdec import NvdecDecoder

            NvdecDecoder.keep_session_across_passes = False
        result = RUNNERS[spec["system"]](spec)
        rc = 0
    except Exception:
        result = {"error": traceback.format_exc()}
        print(result["error"], file=sys.stderr, flush=True)
        rc = 1
    out.write_text(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # skip destructors that could abort after a CUDA fault (see pipeline.py)


def _run_child(
    spec: dict[str, Any], out: Path, timeout: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """One run in a child process of its own; its result, or an error."""
    out.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--run", json.dumps(spec), "--run-out", str(out)]
    try:
        rc: int | None = subprocess.run(command, timeout=timeout, check=False, env=env).returncode
    except subprocess.TimeoutExpired:
        rc = None
    result = json.loads(out.read_text()) if out.exists() else {}
    if rc != 0:
        result.setdefault(
            "error", f"timed out after {timeout:.0f} s" if rc is None else f"exit code {rc}"
        )
    return dict(result)


def _run_sharded(
    spec: dict[str, Any], timeout: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """The run's sources split over `processes` processes (each its own GIL, GPU device and
    model replica) measured over one common window; their results merged."""
    import tempfile

    processes = int(spec["processes"])
    base, extra = divmod(int(spec["sources"]), processes)
    sync = Path(tempfile.mkdtemp(prefix="vdet-sync-"))
    children = []
    for rank in range(processes):
        child = dict(spec, sources=base + (rank < extra), rank=rank, sync_dir=str(sync))
        child.pop("processes")
        out = sync / f"result-{rank}.json"
        command = [sys.executable, __file__, "--run", json.dumps(child), "--run-out", str(out)]
        children.append((subprocess.Popen(command, env=env), out))
        # Staggered, so that 16 processes do not create their CUDA contexts, model replicas
        # and NVDEC sessions in the same second (their connect watchdogs fired at x16).
        time.sleep(_LAUNCH_STAGGER_S)
    deadline = time.monotonic() + timeout
    while len(list(sync.glob("ready-*"))) < processes:
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p, _ in children):
            break
        time.sleep(0.1)
    (sync / "go").write_text(str(time.time() + 1.0))
    results = []
    for process, out in children:
        try:
            rc = process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            rc = None
        result = json.loads(out.read_text()) if out.exists() else {}
        if rc != 0:
            result.setdefault("error", "timed out" if rc is None else f"exit code {rc}")
        results.append(result)
    failed = [r["error"] for r in results if "error" in r]
    if failed:
        return {"error": f"{len(failed)} of {processes} processes failed: {failed[0]}"}
    wall = max(r["duration_s"] for r in results)
    frames = sum(r["frames"] for r in results)
    latencies = [v / 1e3 for r in results for v in (r.get("latency_samples_ms") or [])]
    summary, kept = _latency_summary(latencies)
    merged: dict[str, Any] = {
        "window_start": min(r.get("window_start", float("inf")) for r in results),
        "processes": processes,
        "frames": frames,
        "duration_s": wall,
        "fps_aggregate": sum(r["fps_aggregate"] for r in results),
        "fps_per_source": sum(r["fps_aggregate"] for r in results) / spec["sources"],
        "dropped": sum(r["dropped"] for r in results),
        "latency_ms": summary,
        "latency_samples_ms": kept,
        "gpu_memory_mib": max((r.get("gpu_memory_mib") or 0.0) for r in results),
        "cpu_percent": sum(r.get("cpu_percent") or 0.0 for r in results),
        "rss_mib": sum(r.get("rss_mib") or 0.0 for r in results),
        "per_process_fps": [round(r["fps_aggregate"], 1) for r in results],
    }
    if all("readers" in r for r in results):
        merged["readers"] = {
            key: sum(r["readers"][key] for r in results) for key in results[0]["readers"]
        }
    if "diagnosis" in results[0]:
        merged["diagnosis_first_process"] = results[0]["diagnosis"]
    if all("decoded_fps" in r for r in results):
        merged["decoded_fps"] = sum(r["decoded_fps"] for r in results)
        decoded = sum(r["decoded_fps"] * r["duration_s"] for r in results)
        merged["drop_rate"] = merged["dropped"] / max(1.0, decoded)
    else:
        merged["drop_rate"] = 0.0
    return merged


def _name(spec: dict[str, Any]) -> str:
    pace = "paced" if spec["paced"] else "unpaced"
    batch = f" b{spec['batch']}" if spec.get("batch") else ""
    long_run = " stability" if spec.get("stability") else ""
    wait = f" {spec['host_wait']}" if spec.get("host_wait") not in (None, "block") else ""
    procs = f" x{spec['processes']}proc" if spec.get("processes", 1) > 1 else ""
    mps = " mps" if spec.get("mps") else ""
    sessions = " session-per-pass" if spec.get("session_per_pass") else ""
    shape = f" {spec['input_shape']}" if spec.get("input_shape") else ""
    layers = " nolayers" if spec.get("layer_kernels") is False else ""
    per_stream = f" inflight{spec['frames_per_stream']}" if spec.get("frames_per_stream") else ""
    return (
        f"{spec['system']} {pace} {spec['sources']}{batch}{procs}{mps}{sessions}{shape}{wait}"
        f"{layers}{per_stream}{long_run}"
    )


def _listed_runs(text: str, seconds: float) -> list[dict[str, Any]]:
    """Runs named `system:sources:p|u[:option...]`, space-separated; options: a batch (`8` or
    `b8`), processes (`x4`: the sources split over 4 processes), `mps` (those processes share
    the GPU through an MPS daemon started for the run), `passsess` (a new NVDEC session for
    every pass over the looped clip, as before sessions lived through loops), a host wait
    (block, spin, yield, auto), the input shape (`rect`: each frame at its rectangular input,
    384x640 for the 1080p clip, the service's default; `square`: 640x640) and `diag`
    (thread-stack and GIL diagnostics), `nolayers` (GpuTuning.layer_kernels false: torch's own conv
    bias, SiLU and max pool kernels), `inflightN` (GpuTuning.frames_per_stream N, batched
    runs); `-` is no option."""
    plan = []
    for item in text.split():
        system, sources, pace, *options = item.split(":")
        if system not in RUNNERS or pace not in ("p", "u"):
            raise SystemExit(f"bad run {item!r}: system:sources:p|u[:option...]")
        spec: dict[str, Any] = {
            "system": system,
            "sources": int(sources),
            "paced": pace == "p",
            "batch": None if system == "decode_only" else 1,
            "seconds": seconds,
        }
        for option in options:
            if option in ("", "-"):
                continue
            if option == "diag":
                spec["diagnose"] = True
            elif option == "mps":
                spec["mps"] = True
            elif option == "passsess":
                spec["session_per_pass"] = True
            elif option in ("block", "spin", "yield", "auto"):
                spec["host_wait"] = option
            elif option in ("rect", "square"):
                spec["input_shape"] = option
            elif option == "nolayers":
                spec["layer_kernels"] = False
            elif option.startswith("inflight") and option[8:].isdigit():
                spec["frames_per_stream"] = int(option[8:])
            elif option.startswith("x") and option[1:].isdigit():
                spec["processes"] = int(option[1:])
            elif option.lstrip("b").isdigit():
                if system != "decode_only":
                    spec["batch"] = int(option.lstrip("b"))
            else:
                raise SystemExit(f"bad option {option!r} in run {item!r}")
        plan.append(spec)
    return plan


def _plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    seconds = args.seconds
    if args.runs:
        return _listed_runs(args.runs, seconds)
    plan: list[dict[str, Any]] = []

    def add(system: str, sources: int, paced: bool, batch: int | None = None, **extra: Any) -> None:
        plan.append(
            {
                "system": system,
                "sources": sources,
                "paced": paced,
                "batch": batch,
                "seconds": seconds,
            }
            | extra
        )

    # Most telling first, so that a run cut short by the caller's time limit loses the least.
    for n in args.decode_sources:
        add("decode_only", n, False)
    top = max(args.sources, default=0)
    if top:
        add("vdet", top, True, 1)
        for b in args.batches:
            if b > 1:
                add("vdet", top, True, b)
    for n in args.unpaced_sources:
        for b in sorted(args.batches, reverse=True):
            add("vdet", n, False, b)
    if 1 in args.sources and top != 1:
        add("vdet", 1, True, 1)
    if args.peers:
        add("ultralytics", 1, True)
    for n in args.sources:
        if n not in (1, top):
            add("vdet", n, True, 1)
    if args.peers:
        add("cpu_backend", 1, True)
        if args.cpu_decode_peer:
            add("cpu_decode", 1, True, 1)
    if args.stability_seconds:
        add(
            "vdet",
            args.stability_sources,
            True,
            args.stability_batch,
            seconds=args.stability_seconds,
            sample_every_s=10.0,
            stability=True,
        )
    if args.only:
        plan = [p for p in plan if args.only in _name(p)]
    return plan


def _summarise(report: dict[str, Any]) -> None:
    runs = [r for r in report["runs"] if "error" not in r]
    ceiling = max((r["fps_aggregate"] for r in runs if r["system"] == "decode_only"), default=None)
    unpaced = [r for r in runs if r["system"] == "vdet" and not r["paced"]]
    best = max(unpaced, key=lambda r: r["fps_aggregate"], default=None)
    if ceiling and best:
        report["ceiling"] = {
            "decode_only_fps": ceiling,
            "vdet_unpaced_fps": best["fps_aggregate"],
            "ratio": best["fps_aggregate"] / ceiling,
            "vdet_run": best["name"],
        }
    targets = []
    paced64 = [
        r
        for r in runs
        if r["system"] == "vdet" and r["paced"] and r["sources"] >= 64 and not r.get("stability")
    ]
    for r in paced64:
        lat = r.get("latency_ms") or {}
        ok = r["dropped"] == 0 and lat.get("p99", 1e9) <= 50.0 and r["fps_per_source"] >= 29.0
        targets.append(
            {
                "what": f"{r['name']}: real time, no drops, p99 <= 50 ms",
                "value": f"{r['fps_per_source']:.1f} fps/source, {r['dropped']} dropped, "
                f"p99 {lat.get('p99', float('nan')):.1f} ms",
                "met": ok,
            }
        )
    if ceiling:
        # Each unpaced run that names its input shape, against the same ceiling (rect vs
        # square in one call: bench/gpu/run_session_device.sh, phase rect).
        for r in unpaced:
            if r.get("input_shape"):
                ratio = r["fps_aggregate"] / ceiling
                targets.append(
                    {
                        "what": f"{r['name']}: >= 90% of the decode-only ceiling",
                        "value": f"{r['fps_aggregate']:.0f} / {ceiling:.0f} fps "
                        f"= {100 * ratio:.0f}%",
                        "met": ratio >= 0.9,
                    }
                )
    if "ceiling" in report:
        c = report["ceiling"]
        targets.append(
            {
                "what": "unpaced aggregate >= 90% of the decode-only ceiling",
                "value": f"{c['vdet_unpaced_fps']:.0f} / {c['decode_only_fps']:.0f} fps "
                f"= {100 * c['ratio']:.0f}%",
                "met": c["ratio"] >= 0.9,
            }
        )
    ours = [r for r in runs if r["system"] == "vdet" and r["paced"] and r["sources"] == 1]
    ultra = [r for r in runs if r["system"] == "ultralytics"]
    if ours and ultra and ours[0].get("latency_ms") and ultra[0].get("latency_ms"):
        ratio = ultra[0]["latency_ms"]["p50"] / ours[0]["latency_ms"]["p50"]
        targets.append(
            {
                "what": "single-stream end-to-end p50 >= 5x better than Ultralytics predict",
                "value": f"{ultra[0]['latency_ms']['p50']:.2f} / "
                f"{ours[0]['latency_ms']['p50']:.2f} ms = {ratio:.1f}x",
                "met": ratio >= 5.0,
            }
        )
    stable = [r for r in runs if r.get("stability") and r.get("samples")]
    if stable:
        r = stable[0]
        samples = r["samples"]
        after = [s for s in samples if s["t_s"] >= 30.0] or samples
        first, last = after[0], after[-1]
        rss_growth = 100.0 * (last["rss_mib"] - first["rss_mib"]) / first["rss_mib"]
        gpu_growth = 100.0 * (
            (last["gpu_memory_mib"] - first["gpu_memory_mib"]) / max(first["gpu_memory_mib"], 1)
        )
        report["stability"] = {
            "sources": r["sources"],
            "duration_s": r["duration_s"],
            "samples": samples,
            "rss_growth_pct": rss_growth,
            "gpu_memory_growth_pct": gpu_growth,
            "baseline_at_s": first["t_s"],
        }
        targets.append(
            {
                "what": f"RSS and GPU memory stable over {r['duration_s']:.0f} s with "
                f"{r['sources']} streams (< 5% growth after warm-up)",
                "value": f"RSS {rss_growth:+.1f}%, GPU {gpu_growth:+.1f}%",
                "met": abs(rss_growth) < 5.0 and abs(gpu_growth) < 5.0,
            }
        )
    report["targets"] = targets


def _print_table(report: dict[str, Any]) -> None:
    print(
        f"\n{'run':<34}{'fps':>8}{'fps/src':>9}{'drop':>7}{'p50':>8}{'p99':>8}{'GPU MiB':>9}"
        f"{'CPU%':>7}{'SM%':>5}{'DEC%':>5}"
    )
    for r in report["runs"]:
        if "error" in r:
            print(f"{r['name']:<34} FAILED: {r['error'].strip().splitlines()[-1][:60]}")
            continue
        lat = r.get("latency_ms") or {}
        use = r.get("gpu_utilization") or {}
        print(
            f"{r['name']:<34}{r['fps_aggregate']:>8.0f}{r['fps_per_source']:>9.1f}"
            f"{r['dropped']:>7}{lat.get('p50', float('nan')):>8.1f}"
            f"{lat.get('p99', float('nan')):>8.1f}{r.get('gpu_memory_mib') or 0:>9.0f}"
            f"{r.get('cpu_percent') or 0:>7.0f}{use.get('sm_busy_pct_mean', -1):>5.0f}"
            f"{use.get('nvdec_busy_pct_mean', -1):>5.0f}"
        )
    for t in report.get("targets", []):
        print(f"  [{'met' if t['met'] else 'MISSED'}] {t['what']}: {t['value']}")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("streams.json"))
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per run")
    parser.add_argument("--sources", type=_ints, default=[1, 16, 32, 64])
    parser.add_argument("--decode-sources", type=_ints, default=[64])
    parser.add_argument("--unpaced-sources", type=_ints, default=[64])
    parser.add_argument("--batches", type=_ints, default=[1, 8])
    parser.add_argument("--no-peers", dest="peers", action="store_false")
    parser.add_argument(
        "--cpu-decode-peer", action="store_true", help="also vdet with FFmpeg CPU decode"
    )
    parser.add_argument("--stability-seconds", type=float, default=0.0)
    parser.add_argument("--stability-sources", type=int, default=32)
    parser.add_argument("--stability-batch", type=int, default=1)
    parser.add_argument("--only", help="run only the runs whose name contains this")
    parser.add_argument(
        "--runs",
        help="exactly these runs instead of the default plan, space-separated "
        "system:sources:p|u[:option...] (options: _listed_runs), e.g. "
        "'decode_only:64:u vdet:64:u:1:x8:mps:rect vdet:64:u:1:x8:mps:square'",
    )
    parser.add_argument("--run-timeout", type=float, default=150.0)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--run-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return _child(json.loads(args.run), args.run_out)
    # here: a run's child imports only what its run needs
    from vdet.bench.environment import environment

    report: dict[str, Any] = {
        "benchmark": "streams",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "environment": environment(),
        "model": "demo.onnx (YOLOv8n, 6 classes, FP16 on the GPU)",
        "clip": "sample.mp4 1920x1080 30 fps H.264 (IPPP), looped",
        "runs": [],
    }
    plan = _plan(args)
    sampler = _GpuSampler()
    for i, spec in enumerate(plan, 1):
        name = _name(spec)
        _progress(f"run {i}/{len(plan)}: {name}")
        timeout = args.run_timeout + spec["seconds"]
        result: dict[str, Any]
        with contextlib.ExitStack() as stack:
            try:
                env, mps_log = (
                    stack.enter_context(_mps_daemon()) if spec.get("mps") else (None, None)
                )
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                result = {"error": f"MPS daemon: {exc}"}
            else:
                if spec.get("processes", 1) > 1:
                    result = _run_sharded(spec, timeout, env)
                else:
                    result = _run_child(spec, Path(f"/tmp/vdet-stream-run-{i}.json"), timeout, env)
                if mps_log is not None:
                    result["mps_clients"] = _mps_clients(mps_log)
        utilization = sampler.window(result.get("window_start"), result.get("duration_s"))
        run = {
            "name": name,
            **{k: spec[k] for k in ("system", "sources", "paced", "batch")},
            "processes": spec.get("processes", 1),
            "host_wait": _host_wait(spec),
            **({"stability": True} if spec.get("stability") else {}),
            **({"mps": True} if spec.get("mps") else {}),
            **({"session_per_pass": True} if spec.get("session_per_pass") else {}),
            **({"input_shape": spec["input_shape"]} if spec.get("input_shape") else {}),
            **({"layer_kernels": False} if spec.get("layer_kernels") is False else {}),
            **(
                {"batch_frames_per_stream": spec["frames_per_stream"]}
                if spec.get("frames_per_stream")
                else {}
            ),
            **({"gpu_utilization": utilization} if utilization else {}),
            **result,
        }
        report["runs"].append(run)
        lat = (run.get("latency_ms") or {}).get("p99")
        _progress(
            f"  {name}: "
            + (
                f"{run['fps_aggregate']:.0f} fps, {run['dropped']} dropped, p99 {lat} ms"
                if "error" not in run
                else "FAILED"
            )
        )
        _summarise(report)
        args.out.write_text(json.dumps(report, indent=1))
    sampler.close()
    _print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
