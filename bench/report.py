"""Markdown tables and PNG plots from benchmark result JSON files (a lab tool of a checkout).

    python bench/report.py RESULT.json [...] --out-dir DIR

One markdown file per input (`<stem>.md`) and, for the streams benchmark, PNG plots named
`<stem>-latency_cdf.png`, `<stem>-streams_scaling.png` and `<stem>-stability.png`, all in one
output folder. The markdown links the plots by file name, so it reads correctly from that folder.

The streams schema (``"benchmark": "streams"``) is the main one; `vdet bench serve` results
(``"benchmark": "serve"``) get their own markdown (below) and the streams plots of their
steps. The older result files in
bench/results/ (CPU pipeline, GPU pipeline, CUDA kernels, model eval, INT8 studies) get a table
of their headline figures. A file of none of these shapes is skipped with a note.

Output is deterministic: no dates of its own, fixed figure size and dpi, matplotlib's default
style whatever the user's matplotlibrc says, and no Software/date metadata in the PNGs. A
missing or null field is shown as "—" and never stops the report.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vdet.core.extras import install_hint

DASH = "—"
FIGSIZE = (10.0, 6.0)
DPI = 100
# No "Software" (matplotlib's version) nor any date: the same input gives the same bytes.
PNG_METADATA: dict[str, str | None] = {"Software": None}

LATENCY_CDF = "latency_cdf"
STREAMS_SCALING = "streams_scaling"
STABILITY = "stability"


class ReportError(Exception):
    """An input that cannot be read as JSON at all."""


@dataclass
class Report:
    """What `write_report` wrote and what it skipped (with why)."""

    written: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- value helpers


def _get(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]... or None where any level is missing or not a mapping."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _number(value: Any) -> float | None:
    """A finite int/float as float; None for anything else (bools, strings, NaN, null)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    as_float = float(value)
    return as_float if math.isfinite(as_float) else None


def _fixed(value: Any, digits: int) -> str:
    number = _number(value)
    if number is None:
        return DASH if value is None or isinstance(value, float) else _text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{number:.{digits}f}"


def _auto(value: Any) -> str:
    """A number with precision that suits its size; other values as text."""
    number = _number(value)
    if number is None:
        return DASH if value is None or isinstance(value, float) else _text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    size = abs(number)
    digits = 0 if size >= 10_000 else 1 if size >= 100 else 2 if size >= 1 else 3
    return f"{number:.{digits}f}"


def _yes_no(value: Any) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return DASH if value is None else _text(value)


def _text(value: Any) -> str:
    if value is None:
        return DASH
    if isinstance(value, bool):
        return _yes_no(value)
    if isinstance(value, str):
        return value or DASH
    if isinstance(value, Mapping | list):
        return json.dumps(value, sort_keys=False, separators=(", ", ": "))
    return str(value)


def _cell(value: str) -> str:
    return value.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip() or DASH


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    """A GitHub markdown table; `align` has one letter per column, l or r (default l)."""
    marks = ["---:" if align[i : i + 1] == "r" else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def _bullets(pairs: Sequence[tuple[str, Any]]) -> list[str]:
    lines = [f"- {label}: {_text(value)}" for label, value in pairs if value is not None]
    return [*lines, ""] if lines else []


def _mapping_list(value: Any) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]


# --------------------------------------------------------------------------- recognising files


def result_kind(data: Any) -> str | None:
    """Which schema a result file follows; None when it is not one this module knows.

    One of "serve", "streams", "pipeline", "gpu_pipeline", "cuda_kernels", "model_eval",
    "int8_accuracy", "int8_sensitivity".
    """
    if not isinstance(data, Mapping):
        return None
    if data.get("benchmark") == "serve":
        return "serve"
    runs = _mapping_list(data.get("runs"))
    if data.get("benchmark") == "streams" or (runs and "system" in runs[0]):
        return "streams"
    if data.get("scenario") == "pipeline" and isinstance(data.get("latency_ms"), Mapping):
        return "pipeline"
    models = _mapping_list(data.get("models"))
    if models and any(k in models[0] for k in ("graph", "eager", "streams", "nvdec", "memory")):
        return "gpu_pipeline"
    if isinstance(data.get("preprocess"), Mapping) or isinstance(data.get("decode_nms"), Mapping):
        return "cuda_kernels"
    results = _mapping_list(data.get("results"))
    if results and "precision" in results[0]:
        return "int8_accuracy"
    groups = _mapping_list(data.get("groups"))
    if groups and "group" in groups[0]:
        return "int8_sensitivity"
    if "map50_95" in data:
        return "model_eval"
    return None


def load_result(path: Path) -> Any:
    """The parsed JSON of one result file; ReportError when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not JSON: {exc}") from None


# --------------------------------------------------------------------------- streams markdown


def _paced_word(run: Mapping[str, Any]) -> str:
    paced = run.get("paced")
    return "paced" if paced is True else "unpaced" if paced is False else ""


def _run_label(run: Mapping[str, Any]) -> str:
    name = run.get("name")
    if isinstance(name, str) and name:
        return name
    parts = [_text(run.get("system")), _paced_word(run), _text(run.get("sources"))]
    return " ".join(p for p in parts if p and p != DASH) or "run"


def _drops(run: Mapping[str, Any]) -> str:
    dropped, rate = run.get("dropped"), _number(run.get("drop_rate"))
    if dropped is None and rate is None:
        return DASH
    text = _fixed(dropped, 0) if dropped is not None else DASH
    return f"{text} ({rate * 100:.2f}%)" if rate is not None else text


def _streams_markdown(data: Mapping[str, Any], stem: str, plots: Mapping[str, str]) -> list[str]:
    lines = [f"# Streams benchmark: {stem}", ""]
    env = data.get("environment")
    lines += _bullets(
        [
            ("Date", data.get("date")),
            ("Model", data.get("model")),
            ("Clip", data.get("clip")),
        ]
    )
    if isinstance(env, Mapping) and env:
        lines += ["Environment:", ""]
        lines += _bullets([(str(k), v) for k, v in env.items()])

    runs = _mapping_list(data.get("runs"))
    lines += ["## Runs", ""]
    if runs:
        headers = [
            "Run",
            "System",
            "Sources",
            "Paced",
            "Batch",
            "FPS aggregate",
            "FPS / source",
            "Dropped",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "GPU MiB",
            "CPU %",
            "RSS MiB",
        ]
        # Files whose runs sampled NVML also say how busy the GPU's kernels and NVDEC were.
        busy = any(isinstance(r.get("gpu_utilization"), Mapping) for r in runs)
        if busy:
            headers += ["Kernels busy %", "NVDEC busy %"]
        rows = []
        for run in runs:
            latency = run.get("latency_ms")
            use = run.get("gpu_utilization")
            extra = (
                [
                    _fixed(_get(use, "sm_busy_pct_mean"), 0),
                    _fixed(_get(use, "nvdec_busy_pct_mean"), 0),
                ]
                if busy
                else []
            )
            rows.append(
                [
                    _run_label(run),
                    _text(run.get("system")),
                    _fixed(run.get("sources"), 0),
                    _yes_no(run.get("paced")),
                    _fixed(run.get("batch"), 0),
                    _fixed(run.get("fps_aggregate"), 1),
                    _fixed(run.get("fps_per_source"), 1),
                    _drops(run),
                    _fixed(_get(latency, "p50"), 2),
                    _fixed(_get(latency, "p95"), 2),
                    _fixed(_get(latency, "p99"), 2),
                    _fixed(run.get("gpu_memory_mib"), 0),
                    _fixed(run.get("cpu_percent"), 0),
                    _fixed(run.get("rss_mib"), 0),
                    *extra,
                ]
            )
        lines += _table(headers, rows, align="llrlrrrrrrrrrr" + "rr" * busy)
        noted = [(_run_label(r), r.get("notes")) for r in runs if r.get("notes")]
        if noted:
            lines += ["Run notes:", "", *_bullets(noted)]
    else:
        lines += ["No runs in this file.", ""]

    ceiling = data.get("ceiling")
    if isinstance(ceiling, Mapping):
        ratio = _number(ceiling.get("ratio"))
        lines += ["## Ceiling", ""]
        lines += _table(
            ["Decode-only FPS", "vdet unpaced FPS", "Ratio"],
            [
                [
                    _fixed(ceiling.get("decode_only_fps"), 1),
                    _fixed(ceiling.get("vdet_unpaced_fps"), 1),
                    f"{ratio:.2f} ({ratio * 100:.0f}% of decode)" if ratio is not None else DASH,
                ]
            ],
            align="rrr",
        )

    targets = _mapping_list(data.get("targets"))
    if targets:
        lines += ["## Targets", ""]
        rows = [
            [_text(t.get("what")), _text(t.get("value")), _yes_no(t.get("met"))] for t in targets
        ]
        lines += _table(["Target", "Value", "Met"], rows)

    stability = data.get("stability")
    if isinstance(stability, Mapping):
        lines += ["## Stability", ""]
        lines += _table(
            ["Sources", "Duration s", "RSS growth %", "GPU memory growth %", "Samples"],
            [
                [
                    _fixed(stability.get("sources"), 0),
                    _fixed(stability.get("duration_s"), 0),
                    _fixed(stability.get("rss_growth_pct"), 2),
                    _fixed(stability.get("gpu_memory_growth_pct"), 2),
                    str(len(_mapping_list(stability.get("samples")))),
                ]
            ],
            align="rrrrr",
        )

    for key, title in (("bottlenecks", "Bottlenecks"), ("findings", "Findings")):
        items = data.get(key)
        if isinstance(items, list) and items:
            lines += [f"## {title}", ""]
            lines += [f"- {_text(item)}" for item in items] + [""]

    if plots:
        titles = {
            LATENCY_CDF: "Latency CDF",
            STREAMS_SCALING: "Scaling with sources",
            STABILITY: "Stability",
        }
        lines += ["## Plots", ""]
        for key, name in plots.items():
            lines += [f"![{titles.get(key, key)}]({name})", ""]
    return lines


# --------------------------------------------------------------------------- legacy markdown


def _latency_row(label: str, stats: Any, keys: Sequence[str]) -> list[str]:
    return [label, *(_auto(_get(stats, k)) for k in keys)]


def _pipeline_markdown(data: Mapping[str, Any], stem: str) -> list[str]:
    lines = [f"# Pipeline benchmark: {stem}", ""]
    env = data.get("environment")
    lines += _bullets(
        [
            ("Date", _get(env, "date")),
            ("CPU", _get(env, "host_cpu")),
            ("CPU count", _get(env, "cpu_count")),
            ("Load average (1 min)", _get(env, "load_average_1m")),
            ("Backend", data.get("backend")),
            ("Device", data.get("device")),
            ("Model sha256", _get(data, "model", "sha256")),
            ("Frames", data.get("frames")),
            ("Throughput FPS", _auto(data.get("throughput_fps"))),
            ("Real-time ratio vs source FPS", _auto(data.get("realtime_ratio_vs_source_fps"))),
        ]
    )
    stages = data.get("latency_ms")
    if isinstance(stages, Mapping):
        keys = ("p50", "p95", "p99", "mean", "n")
        rows = [_latency_row(str(name), stats, keys) for name, stats in stages.items()]
        lines += ["## Latency per stage (ms)", ""]
        lines += _table(["Stage", "p50", "p95", "p99", "mean", "n"], rows, align="lrrrrr")
    return lines


def _gpu_pipeline_markdown(data: Mapping[str, Any], stem: str) -> list[str]:
    lines = [f"# GPU pipeline benchmark: {stem}", ""]
    # vdet.bench.pipeline.environment() under "environment"; files from before it have the GPU,
    # torch and Python at the top level.
    env = data.get("environment")
    lines += _bullets(
        [
            ("Date", _get(env, "date") or data.get("date")),
            ("GPU", _get(env, "gpu") or data.get("gpu")),
            ("Driver", _get(env, "driver") or data.get("driver")),
            ("torch", _get(env, "packages", "torch") or data.get("torch")),
            ("Python", _get(env, "python") or data.get("python")),
            ("Percentile method", data.get("percentile_method")),
        ]
    )
    keys = ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "n")
    for model in _mapping_list(data.get("models")):
        lines += [f"## {_text(model.get('model'))}", ""]
        rows = []
        for mode in ("graph", "eager"):
            section = model.get(mode)
            if isinstance(section, Mapping):
                row = _latency_row(mode, section.get("latency"), keys)
                row.append(_auto(_get(section, "host_launch", "p50_ms")))
                rows.append(row)
        if rows:
            lines += ["Latency per frame (ms):", ""]
            headers = ["Mode", "p50", "p90", "p99", "mean", "n", "host launch p50"]
            lines += _table(headers, rows, align="lrrrrrr")
        memory = model.get("memory")
        if isinstance(memory, Mapping):
            lines += _bullets(
                [
                    ("Allocated MiB per source", _auto(memory.get("allocated_mib_per_source"))),
                    ("Reserved MiB per source", _auto(memory.get("reserved_mib_per_source"))),
                ]
            )
        runs = _mapping_list(_get(model, "streams", "runs"))
        if runs:
            lines += ["Streams (unpaced):", ""]
            rows = [
                [
                    _auto(r.get("sources")),
                    _auto(r.get("frames")),
                    _auto(r.get("seconds")),
                    _auto(r.get("frames_per_s")),
                ]
                for r in runs
            ]
            lines += _table(["Sources", "Frames", "Seconds", "FPS"], rows, align="rrrr")
        nvdec = model.get("nvdec")
        if isinstance(nvdec, Mapping):
            lines += _bullets(
                [
                    ("NVDEC decode-only FPS", _auto(nvdec.get("decode_only_fps"))),
                    ("NVDEC decode + detect FPS", _auto(nvdec.get("decode_detect_fps"))),
                ]
            )
    for key in ("notes", "yolov8s_error"):
        if data.get(key):
            lines += [f"{key.capitalize()}: {_text(data[key])}", ""]
    return lines


def _cuda_kernels_markdown(data: Mapping[str, Any], stem: str) -> list[str]:
    lines = [f"# CUDA kernels benchmark: {stem}", ""]
    env = data.get("environment")
    lines += _bullets(
        [
            ("Date", data.get("date")),
            ("GPU", _get(env, "gpu")),
            ("Driver", _get(env, "driver")),
            ("Kernel arch", _get(env, "kernel_arch")),
            ("torch", _get(env, "torch")),
            ("Percentile method", data.get("percentile_method")),
        ]
    )
    if data.get("what"):
        lines += [_text(data["what"]), ""]
    for section in ("preprocess", "decode_nms"):
        cases = data.get(section)
        if not isinstance(cases, Mapping):
            continue
        lines += [f"## {section} (µs)", ""]
        rows, extras = [], []
        for name, value in cases.items():
            if isinstance(value, Mapping) and "median_us" in value:
                rows.append(
                    [
                        str(name),
                        _auto(value.get("median_us")),
                        _auto(value.get("p10_us")),
                        _auto(value.get("p90_us")),
                        _auto(value.get("per_item_median_us")),
                        _auto(value.get("iterations")),
                    ]
                )
            elif isinstance(value, Mapping):
                parts = ", ".join(f"{k} {_auto(v)}" for k, v in value.items())
                extras.append((f"`{name}`", parts or DASH))
            else:
                extras.append((f"`{name}`", _auto(value)))
        if rows:
            headers = ["Case", "median", "p10", "p90", "per item median", "iterations"]
            lines += _table(headers, rows, align="lrrrrr")
        lines += _bullets(extras)
    sanitizer = data.get("sanitizer")
    if isinstance(sanitizer, Mapping):
        lines += ["## Sanitizer", "", *_bullets([(str(k), v) for k, v in sanitizer.items()])]
    return lines


_MAP_KEYS = ("map50_95", "map50", "map75", "map_small", "map_medium", "map_large")


def _model_eval_markdown(data: Mapping[str, Any], stem: str) -> list[str]:
    lines = [f"# Model evaluation: {stem}", ""]
    lines += _bullets(
        [
            ("Date", _get(data, "environment", "date")),
            ("Model", data.get("model")),
            ("Backend", data.get("backend")),
            ("Device", data.get("device")),
            ("Dataset", data.get("dataset")),
            ("Images", data.get("images")),
            ("Objects", data.get("objects")),
            ("Seconds", _auto(data.get("seconds"))),
        ]
    )
    lines += _table(
        ["Metric", "Value"], [[k, _auto(data.get(k))] for k in _MAP_KEYS if k in data], "lr"
    )
    per_class = data.get("per_class_map50_95")
    if isinstance(per_class, Mapping) and per_class:
        lines += ["mAP50-95 per class:", ""]
        rows = [[str(k), _auto(v)] for k, v in per_class.items()]
        lines += _table(["Class", "mAP50-95"], rows, align="lr")
    return lines


def _int8_accuracy_markdown(data: Mapping[str, Any], stem: str) -> list[str]:
    lines = [f"# INT8 accuracy: {stem}", ""]
    lines += _bullets(
        [
            ("Date", _get(data, "environment", "date")),
            ("Study", data.get("study")),
            ("Model", data.get("model")),
            ("Eval set", data.get("eval_set")),
            ("Target", data.get("target")),
        ]
    )
    rows = [
        [
            _text(r.get("precision")),
            _auto(r.get("map50_95")),
            _auto(r.get("map50")),
            _auto(r.get("map75")),
            _auto(r.get("drop_vs_fp32_points")),
            _auto(r.get("eval_seconds")),
        ]
        for r in _mapping_list(data.get("results"))
    ]
    headers = ["Precision", "mAP50-95", "mAP50", "mAP75", "drop vs FP32 (points)", "eval s"]
    lines += _table(headers, rows, align="lrrrrr")
    return lines


def _int8_sensitivity_markdown(data: Mapping[str, Any], stem: str) -> list[str]:
    lines = [f"# INT8 layer sensitivity: {stem}", ""]
    lines += _bullets(
        [
            ("Date", _get(data, "environment", "date")),
            ("Study", data.get("study")),
            ("Model", data.get("model")),
            ("Eval images", data.get("eval_images")),
            ("FP32 mAP50-95", _auto(data.get("fp32_map50_95"))),
            ("INT8 all layers mAP50-95", _auto(data.get("int8_all_layers_map50_95"))),
            ("Note", data.get("note")),
        ]
    )
    groups = _mapping_list(data.get("groups"))
    columns = [
        ("group", "Group"),
        ("what", "What"),
        ("convs_in_group", "Convs"),
        ("fp32_alone_map50_95", "FP32 alone mAP50-95"),
        ("gain_vs_all_int8_points", "gain vs all INT8 (points)"),
        ("int8_alone_map50_95", "INT8 alone mAP50-95"),
        ("loss_vs_fp32_points", "loss vs FP32 (points)"),
    ]
    present = [(k, h) for k, h in columns if any(k in g for g in groups)]
    rows = [[_auto(g.get(k)) for k, _ in present] for g in groups]
    align = "".join("l" if k in ("group", "what") else "r" for k, _ in present)
    lines += _table([h for _, h in present], rows, align=align)
    return lines


_LEGACY: dict[str, Callable[[Mapping[str, Any], str], list[str]]] = {
    "pipeline": _pipeline_markdown,
    "gpu_pipeline": _gpu_pipeline_markdown,
    "cuda_kernels": _cuda_kernels_markdown,
    "model_eval": _model_eval_markdown,
    "int8_accuracy": _int8_accuracy_markdown,
    "int8_sensitivity": _int8_sensitivity_markdown,
}


def render_markdown(
    data: Mapping[str, Any], stem: str, plots: Mapping[str, str] | None = None
) -> str | None:
    """The markdown report of one result; None when its schema is not recognised.

    `plots` maps a plot key (LATENCY_CDF, STREAMS_SCALING, STABILITY) to the PNG's file name,
    linked from the markdown (streams files only).
    """
    kind = result_kind(data)
    if kind is None:
        return None
    if kind == "streams":
        lines = _streams_markdown(data, stem, plots or {})
    elif kind == "serve":
        lines = render_serve_markdown(data, stem, plots or {})
    else:
        lines = _LEGACY[kind](data, stem)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plots

_LINESTYLES = ("-", "--", ":", "-.")


def _style(index: int) -> dict[str, Any]:
    from matplotlib import colormaps

    # tab10 has 10 colours; past those the line style changes.
    color = colormaps["tab10"](index % 10)
    return {"color": color, "linestyle": _LINESTYLES[(index // 10) % 4]}


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, format="png", dpi=DPI, metadata=PNG_METADATA)


def _new_figure(rows: int = 1, cols: int = 1, **kwargs: Any) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, **kwargs)
    return fig, axes


def _finite(values: Any) -> list[float]:
    if not isinstance(values, list):
        return []
    return [v for v in (_number(x) for x in values) if v is not None]


def plot_latency_cdf(runs: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """One empirical CDF per run with latency samples; False (no file) when none has any."""
    series = [(_run_label(r), sorted(_finite(r.get("latency_samples_ms")))) for r in runs]
    series = [(label, values) for label, values in series if values]
    if not series:
        return False
    positive = [v for _, values in series for v in values if v > 0]
    log_x = bool(positive) and max(positive) > 100 * min(positive)
    fig, axes = _new_figure()
    ax = axes[0][0]
    for i, (label, values) in enumerate(series):
        if log_x:
            values = [v for v in values if v > 0]
        n = len(values)
        ax.step(values, [(k + 1) / n for k in range(n)], where="post", label=label, **_style(i))
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel("latency (ms)" + (", log scale" if log_x else ""))
    ax.set_ylabel("fraction of frames")
    ax.set_ylim(0.0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title("Latency CDF")
    ax.legend(fontsize=7, loc="lower right", ncol=1 + (len(series) - 1) // 12)
    _save(fig, path)
    return True


def _variant(run: Mapping[str, Any]) -> str:
    """What sets a run apart beyond system, pacing and batch: its processes (a run split over
    several), whether they shared the GPU through MPS, whether its readers made a new NVDEC
    session per pass over the looped clip, and a host wait other than the default."""
    parts = []
    processes = _number(run.get("processes"))
    if processes is not None and processes > 1:
        parts.append(f" x{processes:.0f} processes")
    if run.get("mps") is True:
        parts.append(" mps")
    if run.get("session_per_pass") is True:
        parts.append(" session per pass")
    wait = run.get("host_wait")
    if wait is None:  # files written before runs recorded it name it instead
        wait = next((w for w in ("spin", "yield", "auto") if f" {w}" in str(run.get("name"))), None)
    if wait not in (None, "block"):
        parts.append(f" {wait}")
    return "".join(parts)


def _scaling_groups(
    runs: Sequence[Mapping[str, Any]],
) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """Runs with a source count, grouped by (system, paced), ordered by sources.

    A group where one source count occurs more than once (batch sizes compared) is split by
    batch, so that each line is one configuration.
    """
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for run in runs:
        if _number(run.get("sources")) is None:
            continue
        key = (_text(run.get("system")), _paced_word(run), _variant(run))
        groups.setdefault(key, []).append(run)
    out: list[tuple[str, list[Mapping[str, Any]]]] = []
    for (system, paced, variant), members in groups.items():
        label = f"{system} {paced}{variant}".strip()
        sources = [m["sources"] for m in members]
        if len(set(sources)) == len(sources):
            out.append((label, sorted(members, key=lambda m: float(m["sources"]))))
            continue
        by_batch: dict[str, list[Mapping[str, Any]]] = {}
        for m in members:
            by_batch.setdefault(_text(m.get("batch")), []).append(m)
        for batch, sub in by_batch.items():
            out.append((f"{label} batch {batch}", sorted(sub, key=lambda m: float(m["sources"]))))
    return out


def plot_streams_scaling(runs: Sequence[Mapping[str, Any]], ceiling: Any, path: Path) -> bool:
    """Aggregate FPS and p99 latency against sources; False (no file) when nothing to plot."""
    groups = _scaling_groups(runs)
    points = [(label, [(float(m["sources"]), m) for m in members]) for label, members in groups]
    if not any(_number(m.get("fps_aggregate")) is not None for _, ms in points for _, m in ms):
        return False
    fig, axes = _new_figure(1, 2)
    fps_ax, p99_ax = axes[0]
    all_sources: set[float] = set()
    fps_lines = p99_lines = 0
    for i, (label, members) in enumerate(points):
        fps = [(s, _number(m.get("fps_aggregate"))) for s, m in members]
        p99 = [(s, _number(_get(m.get("latency_ms"), "p99"))) for s, m in members]
        fps_xy = [(s, v) for s, v in fps if v is not None]
        p99_xy = [(s, v) for s, v in p99 if v is not None]
        style = _style(i)
        if fps_xy:
            fps_ax.plot(*zip(*fps_xy, strict=True), marker="o", label=label, **style)
            fps_lines += 1
        if p99_xy:
            p99_ax.plot(*zip(*p99_xy, strict=True), marker="o", label=label, **style)
            p99_lines += 1
        all_sources.update(s for s, _ in fps_xy + p99_xy)
    decode_only = _number(_get(ceiling, "decode_only_fps"))
    if decode_only is not None:
        fps_ax.axhline(
            decode_only, color="black", linestyle="--", linewidth=1, label="decode-only ceiling"
        )
        fps_lines += 1
    positive = sorted(s for s in all_sources if s > 0)
    for ax in (fps_ax, p99_ax):
        if positive and positive[-1] >= 8 * positive[0]:
            from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(positive))
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("sources")
        ax.grid(True, alpha=0.3)
    fps_ax.set_ylabel("frames/s (all sources)")
    fps_ax.set_title("Aggregate throughput")
    fps_ax.set_ylim(bottom=0)
    p99_ax.set_ylabel("p99 latency (ms)")
    p99_ax.set_title("p99 latency")
    if fps_lines:
        fps_ax.legend(fontsize=7)
    if p99_lines:
        p99_ax.legend(fontsize=7)
        p99_ax.set_ylim(bottom=0)
    else:
        p99_ax.text(0.5, 0.5, "no latency figures", ha="center", transform=p99_ax.transAxes)
    _save(fig, path)
    return True


def plot_stability(stability: Any, path: Path) -> bool:
    """RSS and GPU memory over time; False (no file) when there are no samples to plot."""
    samples = _mapping_list(_get(stability, "samples"))
    panels = [
        ("rss_mib", "RSS (MiB)", "rss_growth_pct"),
        ("gpu_memory_mib", "GPU memory (MiB)", "gpu_memory_growth_pct"),
    ]
    series = []
    for key, ylabel, growth_key in panels:
        xy = [
            (t, v)
            for t, v in ((_number(s.get("t_s")), _number(s.get(key))) for s in samples)
            if t is not None and v is not None
        ]
        series.append((xy, ylabel, _number(_get(stability, growth_key))))
    if not any(xy for xy, _, _ in series):
        return False
    fig, axes = _new_figure(2, 1, sharex=True)
    for i, (xy, ylabel, growth) in enumerate(series):
        ax = axes[i][0]
        if xy:
            ax.plot(*zip(*xy, strict=True), marker=".", **_style(i))
        else:
            ax.text(0.5, 0.5, "no samples", ha="center", transform=ax.transAxes)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        title = ylabel.split(" (")[0]
        ax.set_title(f"{title}: growth {growth:+.2f}%" if growth is not None else title)
    axes[1][0].set_xlabel("time (s)")
    sources = _get(stability, "sources")
    if sources is not None:
        fig.suptitle(f"Stability, {_text(sources)} sources")
    _save(fig, path)
    return True


def write_plots(data: Mapping[str, Any], out_dir: Path, stem: str) -> dict[str, str]:
    """The plots of one streams result into out_dir; plot key -> file name of those written."""
    import matplotlib.style

    runs = _mapping_list(data.get("runs"))
    written: dict[str, str] = {}
    jobs: list[tuple[str, Callable[[Path], bool]]] = [
        (LATENCY_CDF, lambda p: plot_latency_cdf(runs, p)),
        (STREAMS_SCALING, lambda p: plot_streams_scaling(runs, data.get("ceiling"), p)),
        (STABILITY, lambda p: plot_stability(data.get("stability"), p)),
    ]
    # The default style, whatever a matplotlibrc on this machine says: same input, same PNG.
    with matplotlib.style.context("default"):
        for key, plot in jobs:
            name = f"{stem}-{key}.png"
            if plot(out_dir / name):
                written[key] = name
    return written


# --------------------------------------------------------------------------- files and CLI


def write_report(inputs: Sequence[Path], out_dir: Path) -> Report:
    """Markdown (`<stem>.md`) and, for streams results, PNG plots of each input into out_dir.

    Unrecognised files are skipped with a note in the returned Report; an unreadable or
    non-JSON file raises ReportError before anything is written.
    """
    loaded = [(Path(p), load_result(Path(p))) for p in inputs]
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report()
    stems = [p.stem for p, _ in loaded]
    for path, data in loaded:
        stem = path.stem
        if stems.count(stem) > 1:
            report.notes.append(f"{path}: another input has the same name {stem!r}; overwritten")
        kind = result_kind(data)
        if kind is None:
            report.notes.append(f"{path}: not a benchmark result this report knows; skipped")
            continue
        plots: dict[str, str] = {}
        if kind in ("streams", "serve"):
            try:
                plots = write_plots(_as_streams(data) if kind == "serve" else data, out_dir, stem)
            except ModuleNotFoundError as exc:  # matplotlib: the report (or dev) extra
                report.notes.append(
                    f"{path}: no plots ({exc}); markdown only. The plots need the report "
                    f"extra: {install_hint('report')}"
                )
        markdown = render_markdown(data, stem, plots)
        assert markdown is not None  # the kind was recognised above
        md_path = out_dir / f"{stem}.md"
        md_path.write_text(markdown, encoding="utf-8")
        report.written += [md_path, *(out_dir / name for name in plots.values())]
    return report


def _as_streams(data: Mapping[str, Any]) -> dict[str, Any]:
    """A serve result's steps as streams runs, for the streams plots (`as_streams_runs`)."""
    return {"runs": as_streams_runs(data)}


def run_cli(inputs: Sequence[Path], out_dir: Path | None) -> int:
    """`bench/report.py IN.json ... --out-dir DIR`: writes, prints what it wrote as JSON."""
    if not inputs:
        print("bench/report.py: no result files given", file=sys.stderr)
        return 2
    if out_dir is None:
        print("bench/report.py: --out-dir is required", file=sys.stderr)
        return 2
    try:
        report = write_report(inputs, out_dir)
    except ReportError as exc:
        print(f"bench/report.py: {exc}", file=sys.stderr)
        return 2
    for note in report.notes:
        print(f"bench/report.py: {note}", file=sys.stderr)
    print(json.dumps({"written": [str(p) for p in report.written], "notes": report.notes}))
    return 0


# ---- `vdet bench serve` results ------------------------------------------------------------------


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


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="*", type=Path, help="result JSON files")
    parser.add_argument("--out-dir", type=Path, default=None, help="where to write the report")
    args = parser.parse_args(argv)
    return run_cli(args.inputs, args.out_dir)


if __name__ == "__main__":
    raise SystemExit(main())
