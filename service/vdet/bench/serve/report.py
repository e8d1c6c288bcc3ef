"""Markdown of a `vdet bench serve` result, and its steps in the streams benchmark's shape.

`vdet bench report` (vdet.bench_report) recognises these files by `"benchmark": "serve"`, asks
this module for their markdown, and draws their plots with its own streams plots from
`as_streams_runs` (one run per variant and stream count, plus the shards harness's runs). Like
the rest of the report: deterministic, tolerant of missing fields (shown as a dash), and the
input is read as plain JSON, so files from older or newer versions still render.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vdet.bench_report import (
    DASH,
    LATENCY_CDF,
    STREAMS_SCALING,
    _bullets,
    _fixed,
    _get,
    _mapping_list,
    _number,
    _table,
    _text,
    _yes_no,
)


def _pair(stats: Any, digits: int = 1) -> str:
    """'p50 / p99' of a latency summary."""
    if not isinstance(stats, Mapping):
        return DASH
    return f"{_fixed(stats.get('p50'), digits)} / {_fixed(stats.get('p99'), digits)}"


def _settings(variant: Mapping[str, Any]) -> str:
    env = variant.get("environment")
    if not isinstance(env, Mapping) or not env:
        return "(defaults)"
    return " ".join(f"{k}={v}" for k, v in env.items())


def _shards_by_sources(data: Mapping[str, Any]) -> dict[float, Mapping[str, Any]]:
    runs = _mapping_list(_get(data, "shards", "runs"))
    out = {}
    for run in runs:
        sources = _number(run.get("sources"))
        if sources is not None and "error" not in run:
            out[sources] = run
    return out


def _ratio(value: Any, base: Any) -> str:
    v, b = _number(value), _number(base)
    if v is None or b is None or b == 0:
        return DASH
    return f"{v / b:.2f}"


def _steps(data: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    return [
        (variant, step)
        for variant in _mapping_list(data.get("variants"))
        for step in _mapping_list(variant.get("steps"))
    ]


def _dropped(step: Mapping[str, Any]) -> str:
    return f"{_fixed(step.get('dropped'), 0)} / {_fixed(step.get('server_dropped'), 0)}"


def _cutoffs(step: Mapping[str, Any]) -> str:
    """How many closes, and why: the end event sent before them (lagging, shutdown) or the
    close code."""
    count = _fixed(step.get("cutoffs"), 0)
    why = set()
    for client in _mapping_list(step.get("clients")):
        for close in _mapping_list(client.get("closes")):
            why.add(_text(close.get("event") or f"code {_text(close.get('code'))}"))
    return f"{count} ({', '.join(sorted(why))})" if why else count


def _ultralytics_mean(data: Mapping[str, Any]) -> float | None:
    """Ultralytics' frames/s averaged over the baselines that ran; None without one."""
    rates = [
        rate
        for u in _mapping_list(data.get("ultralytics_baselines"))
        if (rate := _number(u.get("ultralytics_fps"))) is not None
    ]
    return sum(rates) / len(rates) if rates else None


def _results_rows(data: Mapping[str, Any]) -> list[list[str]]:
    first = next(iter(_mapping_list(data.get("variants"))), {})
    baseline = {
        _number(s.get("streams")): s.get("results_per_s") for s in _mapping_list(first.get("steps"))
    }
    shards = _shards_by_sources(data)
    rows = []
    for variant, step in _steps(data):
        streams = _number(step.get("streams"))
        shard = shards.get(streams) if streams is not None else None
        rows.append(
            [
                _text(variant.get("name")),
                _fixed(step.get("streams"), 0),
                f"{_fixed(step.get('results_per_s'), 1)} "
                f"({_fixed(step.get('expected_results_per_s'), 0)})",
                _pair(step.get("latency_ms")),
                _dropped(step),
                _fixed(step.get("missed"), 0),
                _cutoffs(step),
                _yes_no(step.get("real_time")),
                _ratio(step.get("results_per_s"), baseline.get(streams)),
                _ratio(step.get("results_per_s"), shard.get("fps_aggregate") if shard else None),
            ]
        )
    return rows


def _control_rows(data: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for variant, step in _steps(data):
        calls = step.get("control")
        errors = _get(calls, "errors")
        rows.append(
            [
                _text(variant.get("name")),
                _fixed(step.get("streams"), 0),
                _pair(_get(calls, "get_detections_ms")),
                _pair(_get(calls, "post_ms")),
                _pair(_get(calls, "delete_ms")),
                _text(errors) if errors else "none",
            ]
        )
    return rows


def _gc_cell(stalls: Any, generation: str) -> str:
    pauses = _get(stalls, "gc", generation)
    if not isinstance(pauses, Mapping):
        return DASH
    return f"{_fixed(pauses.get('count'), 0)} / {_fixed(pauses.get('max_ms'), 1)}"


def _stall_rows(data: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for variant, step in _steps(data):
        stalls = step.get("api_stalls")
        rows.append(
            [
                _text(variant.get("name")),
                _fixed(step.get("streams"), 0),
                f"{_fixed(_get(stalls, 'loop_lag_p99_ms'), 1)} / "
                f"{_fixed(_get(stalls, 'loop_lag_max_ms'), 1)}",
                _fixed(_get(stalls, "loop_lag_mean_ms"), 2),
                _gc_cell(stalls, "0"),
                _gc_cell(stalls, "1"),
                _gc_cell(stalls, "2"),
            ]
        )
    return rows


def _resource_rows(data: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for variant, step in _steps(data):
        server, gpu, bench = step.get("server"), step.get("gpu"), step.get("bench_client")
        rows.append(
            [
                _text(variant.get("name")),
                _fixed(step.get("streams"), 0),
                _fixed(_get(server, "processes"), 0),
                _fixed(_get(server, "cpu_percent"), 0),
                _fixed(_get(server, "cpu_percent_per_stream"), 1),
                _fixed(_get(server, "pss_mib"), 0),
                _fixed(_get(server, "memory_mib_per_stream"), 1),
                _fixed(_get(gpu, "used_mib"), 0),
                _fixed(_get(gpu, "used_mib_per_stream"), 1),
                f"{_fixed(_get(bench, 'clients_cpu_percent_max'), 0)} / "
                f"{_fixed(_get(bench, 'control_cpu_percent'), 0)}",
                _yes_no(_get(bench, "client_bound")),
            ]
        )
    return rows


def _kill_rows(data: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for variant, step in _steps(data):
        killed = step.get("kill")
        if not isinstance(killed, Mapping):
            continue
        names = killed.get("killed_streams")
        count = len(names) if isinstance(names, list) else None
        total = _number(step.get("streams"))
        worker = (
            f"{_text(killed.get('worker'))} ({_text(count)} of {_fixed(total, 0)})"
            if killed.get("worker")
            else DASH
        )
        rows.append(
            [
                _text(variant.get("name")),
                _fixed(step.get("streams"), 0),
                worker,
                _fixed(killed.get("t_s"), 1),
                f"{_fixed(killed.get('others_missing'), 0)} / "
                f"{_fixed(killed.get('others_server_dropped'), 0)}",
                _fixed(killed.get("others_max_gap_ms"), 0),
                _fixed(killed.get("failed_after_s"), 2),
                f"{_fixed(killed.get('republished_s_max'), 2)} / "
                f"{_fixed(killed.get('republished_s_median'), 2)}",
                f"{_text(killed.get('republished'))} of {_text(count)}",
                _yes_no(killed.get("clients_connected")),
                str(killed.get("error")).splitlines()[0] if killed.get("error") else DASH,
            ]
        )
    return rows


def render_serve_markdown(
    data: Mapping[str, Any], stem: str, plots: Mapping[str, str] | None = None
) -> list[str]:
    """The report's lines (the caller joins them)."""
    machine, options = data.get("machine"), data.get("options")
    clip = _get(options, "clip")
    clip_text = (
        f"{_text(_get(clip, 'width'))}x{_text(_get(clip, 'height'))} "
        f"{_fixed(_get(clip, 'fps'), 0)} fps {_text(_get(clip, 'codec'))} "
        f"({_text(_get(clip, 'path'))})"
    )
    gpus = _get(machine, "gpus")
    lines = [f"# Serve benchmark: {stem}", ""]
    lines += _bullets(
        [
            ("Date", data.get("date")),
            ("vdet", f"{_text(data.get('vdet_version'))}, commit {_text(data.get('vdet_commit'))}"),
            (
                "CPU",
                f"{_text(_get(machine, 'host_cpu'))}, {_text(_get(machine, 'cpu_count'))} "
                f"cores, load average {_text(_get(machine, 'load_average_1m'))} at the start, "
                f"{_text(_get(machine, 'load_average_1m_end'))} at the end",
            ),
            ("GPU", "; ".join(str(g) for g in gpus) if isinstance(gpus, list) and gpus else "none"),
            ("Backend", _get(options, "backend")),
            ("Clip", clip_text),
            (
                "Each step",
                f"{_fixed(_get(options, 'duration_s'), 0)} s measured after "
                f"{_fixed(_get(options, 'warmup_s'), 0)} s of warm-up, "
                f"{_text(_get(options, 'clients'))} WebSocket client(s) on /v1/events, "
                f"a control call every {_text(_get(options, 'control_interval_s'))} s",
            ),
        ]
    )
    pipeline = data.get("pipeline_baseline")
    if isinstance(pipeline, Mapping):
        lines += _bullets(
            [
                (
                    "Pipeline alone, same clip, same run (vdet bench pipeline: one stream, "
                    "unpaced, no service)",
                    f"{_fixed(pipeline.get('throughput_fps'), 2)} fps, inference p50 "
                    f"{_fixed(_get(pipeline, 'latency_ms', 'inference', 'p50'), 1)} ms"
                    + (f"; error: {_text(pipeline.get('error'))}" if pipeline.get("error") else ""),
                )
            ]
        )
    lines += _bullets(
        [
            (
                f"Ultralytics predict {_text(u.get('when'))} the variants, same clip and model "
                "(vdet bench pipeline --baseline ultralytics: no service)",
                f"{_fixed(u.get('ultralytics_fps'), 2)} fps (vdet's pipeline alternating with "
                f"it: {_fixed(u.get('vdet_pipeline_fps'), 2)} fps; boxes matched "
                f"{_fixed(u.get('boxes_matched'), 4)})"
                + (f"; error: {_text(u.get('error'))}" if u.get("error") else ""),
            )
            for u in _mapping_list(data.get("ultralytics_baselines"))
        ]
    )
    ultralytics_fps = _ultralytics_mean(data)
    if ultralytics_fps is not None:
        lines += _bullets(
            [
                (
                    f"{_text(variant.get('name'))}, {_fixed(step.get('streams'), 0)} "
                    "stream(s): results/s over Ultralytics' frames/s (mean of before and after)",
                    _ratio(step.get("results_per_s"), ultralytics_fps),
                )
                for variant, step in _steps(data)
            ]
        )
    notes = data.get("notes")
    if isinstance(notes, list) and notes:
        lines += ["Notes:", "", *(f"- {_text(n)}" for n in notes), ""]

    variants = _mapping_list(data.get("variants"))
    lines += ["## Variants", ""]
    rows = []
    for v in variants:
        gone = v.get("exit")
        error = v.get("error")
        rows.append(
            [
                _text(v.get("name")),
                _settings(v),
                _fixed(v.get("ready_seconds"), 1),
                f"{_text(_get(gone, 'exit_code'))} ({_text(_get(gone, 'signal_sent'))}, "
                f"{_fixed(_get(gone, 'stop_seconds'), 1)} s)",
                _text(_get(gone, "orphans")) if _get(gone, "orphans") else "none",
                str(error).splitlines()[0] if error else DASH,
            ]
        )
    lines += _table(
        ["Variant", "Environment", "Ready s", "Exit (signal, stop)", "Orphans", "Error"], rows
    )

    lines += [
        "## At the client",
        "",
        "Results/s of the slowest client (expected: streams x clip fps); latency from the "
        "frame's arrival at the server to receipt by the client, worst client, ms; dropped: "
        "frame-index gaps seen by a client / the server's vdet_frames_dropped_total; missed: "
        "results a client never got; cut off: server closes of clients, with the end event sent "
        "before them (lagging: the client fell too far behind) or the close code.",
        "",
    ]
    lines += _table(
        [
            "Variant",
            "Streams",
            "Results/s (expected)",
            "p50 / p99 ms",
            "Dropped (client / server)",
            "Missed",
            "Cut off",
            "Real time",
            "vs first variant",
            "vs shards",
        ],
        _results_rows(data),
        align="lrrrrrrlrr",
    )
    kill_rows = _kill_rows(data)
    if kill_rows:
        lines += [
            "## A worker killed mid-window",
            "",
            "One worker process (the one running most of the step's streams) killed with "
            "SIGKILL this many seconds into the window. Other streams (those of the other "
            "workers): frames missing at a client (frame-index gaps) / the server's "
            "vdet_frames_dropped_total over the window, and the longest time without a result "
            "of one stream at a client (the clip's frame interval when nothing stalled). "
            "Killed streams: kill -> GET /v1/streams showed them all failed; kill -> first "
            "result of a frame read after the kill at every client, slowest stream / median. "
            "The step's results/s include the killed streams' outage; a stream started again "
            "counts its frames from 0, so the outage is not in its dropped frames: it is the "
            "'again after' column.",
            "",
        ]
        lines += _table(
            [
                "Variant",
                "Streams",
                "Killed (its streams)",
                "At s",
                "Others: missing (client / server)",
                "Others: longest gap ms",
                "Killed: failed after s",
                "Killed: again after s (max / median)",
                "Published again",
                "Clients connected",
                "Error",
            ],
            kill_rows,
            align="lrlrrrrrrll",
        )
    lines += ["## Control calls under load (ms, p50 / p99)", ""]
    lines += _table(
        ["Variant", "Streams", "GET detections", "POST stream", "DELETE stream", "Errors"],
        _control_rows(data),
        align="lrrrrl",
    )
    lines += [
        "## API process stalls",
        "",
        "From the server's own histograms over the window: how late its event loop woke from "
        "a 50 ms sleep (p99 / max, ms: upper bounds of histogram buckets), and its garbage "
        "collections by generation (count / longest, ms, a bucket bound; 2: full). A full "
        "collection stops every thread of the API process.",
        "",
    ]
    lines += _table(
        [
            "Variant",
            "Streams",
            "Loop lag p99 / max",
            "Lag mean",
            "GC gen 0",
            "GC gen 1",
            "GC gen 2",
        ],
        _stall_rows(data),
        align="lrrrrrr",
    )
    lines += [
        "## Resources",
        "",
        "The server's whole process tree over the window (CPU, % of one core) and at its end "
        "(PSS: shared pages split); per stream: above the server with no streams. Bench "
        "client: busiest WebSocket client process / the control loop's process, CPU %.",
        "",
    ]
    lines += _table(
        [
            "Variant",
            "Streams",
            "Processes",
            "CPU %",
            "CPU % / stream",
            "PSS MiB",
            "MiB / stream",
            "GPU MiB",
            "GPU MiB / stream",
            "Bench client CPU %",
            "Client bound",
        ],
        _resource_rows(data),
        align="lrrrrrrrrrl",
    )

    shards = data.get("shards")
    if isinstance(shards, Mapping):
        lines += ["## Shards harness (bench/gpu/streams.py)", ""]
        if shards.get("error"):
            lines += [f"Error: {_text(shards.get('error'))}", ""]
        rows = [
            [
                _text(r.get("name")),
                _fixed(r.get("sources"), 0),
                _fixed(r.get("fps_aggregate"), 1),
                _fixed(r.get("fps_per_source"), 1),
                _fixed(r.get("dropped"), 0),
                _pair(r.get("latency_ms"), 2),
                _fixed(r.get("cpu_percent"), 0),
                _fixed(r.get("rss_mib"), 0),
                _fixed(r.get("gpu_memory_mib"), 0),
                str(r["error"]).strip().splitlines()[-1] if r.get("error") else DASH,
            ]
            for r in _mapping_list(shards.get("runs"))
        ]
        lines += _table(
            [
                "Run",
                "Sources",
                "FPS",
                "FPS / source",
                "Dropped",
                "p50 / p99 ms (to published)",
                "CPU %",
                "RSS MiB",
                "GPU MiB",
                "Error",
            ],
            rows,
            align="lrrrrrrrrl",
        )

    failed = [(v.get("name"), v.get("error")) for v in variants if v.get("error")]
    failed += [
        (f"{_text(v.get('name'))} N={_text(s.get('streams'))}", s.get("error"))
        for v, s in _steps(data)
        if s.get("error")
    ]
    if failed:
        lines += ["## Errors", ""]
        for name, error in failed:
            lines += [f"{_text(name)}:", "", "```", str(error).strip(), "```", ""]

    if plots:
        titles = {LATENCY_CDF: "Latency CDF at the client", STREAMS_SCALING: "Scaling with streams"}
        lines += ["## Plots", ""]
        for key, name in plots.items():
            lines += [f"![{titles.get(key, key)}]({name})", ""]
    return lines


def as_streams_runs(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each (variant, streams) as a run of the streams schema, then the shards' runs, for the
    streams plots: results/s at the client as `fps_aggregate`, the first client's latency."""
    runs: list[dict[str, Any]] = []
    for variant, step in _steps(data):
        clients: Sequence[Mapping[str, Any]] = _mapping_list(step.get("clients"))
        samples = clients[0].get("latency_samples_ms") if clients else None
        runs.append(
            {
                "name": f"{_text(variant.get('name'))} {_text(step.get('streams'))}",
                "system": _text(variant.get("name")),
                "sources": step.get("streams"),
                "paced": True,
                "fps_aggregate": step.get("results_per_s"),
                "latency_ms": step.get("latency_ms"),
                "latency_samples_ms": samples if isinstance(samples, list) else [],
            }
        )
    for run in _mapping_list(_get(data, "shards", "runs")):
        if "error" not in run:
            runs.append({**run, "system": "shards harness"})
    return runs
