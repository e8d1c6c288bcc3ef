"""bench/report.py (the lab's renderer): markdown tables and PNG plots from benchmark result
files, tested on results made here (never on the committed ones)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from support.lab import load_script

bench_report = load_script("report.py")
DASH = bench_report.DASH
plot_latency_cdf = bench_report.plot_latency_cdf
render_markdown = bench_report.render_markdown
result_kind = bench_report.result_kind
write_report = bench_report.write_report
main = bench_report.main
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STEM = "2026-12-02-streams-test"


def _samples(seed: int, median_ms: float, n: int = 500) -> list[float]:
    rng = random.Random(seed)
    return [round(rng.lognormvariate(0.0, 0.4) * median_ms, 3) for _ in range(n)]


def _run(system: str, sources: int, paced: bool, **fields: Any) -> dict[str, Any]:
    fps_per_source = 30.0 if paced else 40.0
    run: dict[str, Any] = {
        "name": f"{system} {'paced' if paced else 'unpaced'} {sources}",
        "system": system,
        "sources": sources,
        "paced": paced,
        "batch": 8,
        "duration_s": 30.0,
        "frames": int(sources * fps_per_source * 30),
        "fps_aggregate": sources * fps_per_source,
        "fps_per_source": fps_per_source,
        "dropped": 0,
        "drop_rate": 0.0,
        "latency_ms": {"p50": 8.1, "p95": 12.0, "p99": 15.2 + sources / 10, "max": 30.0},
        "latency_samples_ms": _samples(sources, 8.0),
        "gpu_memory_mib": 2048.0,
        "cpu_percent": 350.0,
        "rss_mib": 900.0,
        "notes": "",
    }
    run.update(fields)
    return run


def streams_result() -> dict[str, Any]:
    runs = [_run("vdet", n, True) for n in (1, 8, 16, 32, 64)]
    runs += [_run("vdet", n, False, batch=16) for n in (8, 64)]
    runs.append(
        _run(
            "decode_only",
            64,
            False,
            batch=None,
            fps_aggregate=2500.0,
            latency_ms=None,
            latency_samples_ms=None,
            gpu_memory_mib=None,
            cpu_percent=None,
        )
    )
    runs.append(
        _run(
            "ultralytics",
            4,
            True,
            batch=None,
            fps_aggregate=96.5,
            fps_per_source=24.125,
            dropped=710,
            drop_rate=0.1958,
            # Slow tail: the CDF needs a log axis.
            latency_samples_ms=[*_samples(7, 40.0), 9000.0],
            notes="predict() per frame | no batching",
        )
    )
    return {
        "benchmark": "streams",
        "date": "2026-12-02 16:00:00",
        "environment": {"gpu": "NVIDIA H200", "driver": "580.159.04", "torch": "2.11.0"},
        "model": "demo.onnx@7887baa4",
        "clip": "sample.mp4 1920x1080 30 fps H.264",
        "runs": runs,
        "stability": {
            "sources": 32,
            "duration_s": 300,
            "samples": [
                {"t_s": t, "rss_mib": 900.0 + t / 30, "gpu_memory_mib": 2048.0}
                for t in range(0, 301, 10)
            ],
            "rss_growth_pct": 1.2,
            "gpu_memory_growth_pct": 0.0,
        },
        "ceiling": {"decode_only_fps": 2500.0, "vdet_unpaced_fps": 2300.0, "ratio": 0.92},
        "targets": [
            {"what": "64 paced streams, no drops, p99 <= 50 ms", "value": "p99 21.6", "met": True},
            {"what": "unpaced | decode >= 0.9", "value": None, "met": None},
        ],
        "bottlenecks": ["NVDEC sessions above 48 sources"],
    }


def _write(tmp_path: Path, data: Any, stem: str = STEM) -> Path:
    path = tmp_path / f"{stem}.json"
    path.write_text(json.dumps(data))
    return path


def _assert_png(path: Path) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1024
    # No matplotlib version or date in the file: the same input gives the same bytes.
    assert b"Software" not in data and b"matplotlib" not in data.lower()


def _rows(markdown: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip().strip("|").split(" | ")]
        for line in markdown.splitlines()
        if line.startswith("| ")
    ]


def test_streams_markdown_has_runs_ceiling_and_targets(tmp_path: Path) -> None:
    report = write_report([_write(tmp_path, streams_result())], tmp_path / "out")
    md_path = tmp_path / "out" / f"{STEM}.md"
    assert report.notes == []
    assert report.written[0] == md_path
    markdown = md_path.read_text()
    rows = _rows(markdown)
    by_name = {row[0]: row for row in rows}
    assert by_name["vdet paced 64"] == [
        "vdet paced 64",
        "vdet",
        "64",
        "yes",
        "8",
        "1920.0",
        "30.0",
        "0 (0.00%)",
        "8.10",
        "12.00",
        "21.60",
        "2048",
        "350",
        "900",
    ]
    # Nulls read as a dash, not "None" or a crash.
    decode = by_name["decode_only unpaced 64"]
    assert decode[4] == DASH and decode[8:13] == [DASH] * 5
    slow = by_name["ultralytics paced 4"]
    assert slow[5:8] == ["96.5", "24.1", "710 (19.58%)"]
    assert "None" not in markdown
    # Ceiling, targets (a pipe in a cell is escaped), stability, bottlenecks, notes.
    assert ["2500.0", "2300.0", "0.92 (92% of decode)"] in rows
    assert ["64 paced streams, no drops, p99 <= 50 ms", "p99 21.6", "yes"] in rows
    assert ["unpaced \\| decode >= 0.9", DASH, DASH] in rows
    assert ["32", "300", "1.20", "0.00", "31"] in rows
    assert "- NVDEC sessions above 48 sources" in markdown
    assert "- ultralytics paced 4: predict() per frame | no batching" in markdown
    assert "- gpu: NVIDIA H200" in markdown and "- Model: demo.onnx@7887baa4" in markdown
    for key in ("latency_cdf", "streams_scaling", "stability"):
        assert f"]({STEM}-{key}.png)" in markdown


def test_mps_runs_are_their_own_series_and_busy_columns_appear(tmp_path: Path) -> None:
    _scaling_groups = bench_report._scaling_groups

    busy = {"sm_busy_pct_mean": 93.4, "nvdec_busy_pct_mean": 35.0, "samples": 80}
    shared = _run("vdet", 64, True, processes=8, mps=True, gpu_utilization=busy)
    shared["name"] = "vdet paced 64 x8 mps"
    sliced = _run("vdet", 64, True, processes=8)  # no NVML figures: dashes
    sliced["name"] = "vdet paced 64 x8"
    data = {"benchmark": "streams", "runs": [shared, sliced], "findings": ["MPS: +16%"]}
    write_report([_write(tmp_path, data)], tmp_path / "out")
    markdown = (tmp_path / "out" / f"{STEM}.md").read_text()
    assert "## Findings\n\n- MPS: +16%\n" in markdown
    rows = {r[0]: r for r in _rows(markdown)}
    assert rows["Run"][-2:] == ["Kernels busy %", "NVDEC busy %"]
    assert rows["vdet paced 64 x8 mps"][-2:] == ["93", "35"]
    assert rows["vdet paced 64 x8"][-2:] == [DASH, DASH]
    passes = _run("vdet", 64, True, processes=8, mps=True, session_per_pass=True)
    labels = [label for label, _ in _scaling_groups([shared, sliced, passes])]
    assert labels == [
        "vdet paced x8 processes mps",
        "vdet paced x8 processes",
        "vdet paced x8 processes mps session per pass",
    ]


def test_streams_plots_are_pngs_and_deterministic(tmp_path: Path) -> None:
    source = _write(tmp_path, streams_result())
    first = write_report([source], tmp_path / "a")
    second = write_report([source], tmp_path / "b")
    names = [p.name for p in first.written]
    assert names == [
        f"{STEM}.md",
        f"{STEM}-latency_cdf.png",
        f"{STEM}-streams_scaling.png",
        f"{STEM}-stability.png",
    ]
    for path in first.written[1:]:
        _assert_png(path)
    for a, b in zip(first.written, second.written, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_all_null_streams_fields_do_not_crash(tmp_path: Path) -> None:
    keys = [
        "system",
        "sources",
        "paced",
        "batch",
        "duration_s",
        "frames",
        "fps_aggregate",
        "fps_per_source",
        "dropped",
        "drop_rate",
        "latency_ms",
        "latency_samples_ms",
        "gpu_memory_mib",
        "cpu_percent",
        "rss_mib",
        "notes",
    ]
    data = {
        "benchmark": "streams",
        "date": None,
        "environment": None,
        "runs": [dict.fromkeys(keys), {"name": "bare"}, "not a run"],
        "stability": {"samples": [{"t_s": None}], "rss_growth_pct": None},
        "ceiling": {"decode_only_fps": None, "ratio": None},
        "targets": [{"what": None}],
        "bottlenecks": None,
    }
    report = write_report([_write(tmp_path, data)], tmp_path / "out")
    # Nothing to plot: only the markdown.
    assert [p.name for p in report.written] == [f"{STEM}.md"]
    markdown = report.written[0].read_text()
    assert "None" not in markdown
    rows = _rows(markdown)
    assert ["run", *[DASH] * 13] in rows
    assert ["bare", *[DASH] * 13] in rows
    assert [DASH, DASH, DASH] in rows  # ceiling and target


def test_streams_without_optional_sections(tmp_path: Path) -> None:
    data = streams_result()
    for key in ("stability", "ceiling", "targets", "bottlenecks"):
        del data[key]
    report = write_report([_write(tmp_path, data)], tmp_path / "out")
    assert [p.name for p in report.written] == [
        f"{STEM}.md",
        f"{STEM}-latency_cdf.png",
        f"{STEM}-streams_scaling.png",
    ]
    markdown = report.written[0].read_text()
    assert "## Ceiling" not in markdown and "## Targets" not in markdown


def test_latency_cdf_narrow_range_is_linear(tmp_path: Path) -> None:
    runs = [_run("vdet", 1, True)]
    assert plot_latency_cdf(runs, tmp_path / "cdf.png")
    _assert_png(tmp_path / "cdf.png")
    assert not plot_latency_cdf([_run("vdet", 1, True, latency_samples_ms=[])], tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_gpu_pipeline_machine_from_its_environment_or_the_older_top_level() -> None:
    """bench/gpu/pipeline.py writes vdet.bench.environment.environment() and its percentile
    method;
    files from before it have the GPU, torch and Python at the top level."""
    latency = {"p50_ms": 1.5, "p90_ms": 2.0, "p99_ms": 3.0, "mean_ms": 1.6, "n": 300}
    model = {"model": "demo.onnx", "graph": {"latency": latency, "host_launch": latency}}
    env = {
        "date": "2026-12-03T17:00:00+00:00",
        "gpu": "NVIDIA H200",
        "driver": "580.159.04, 1980 MHz, 143771 MiB",
        "python": "3.11.2",
        "packages": {"torch": "2.14.1"},
    }
    new = {"environment": env, "percentile_method": "nearest", "models": [model]}
    old = {"gpu": "NVIDIA H100", "torch": "2.11.0", "python": "3.11.1", "models": [model]}
    rendered = [render_markdown(data, "gpu-pipeline") or "" for data in (new, old)]
    for expected in (
        "- Date: 2026-12-03T17:00:00+00:00",
        "- GPU: NVIDIA H200",
        "- Driver: 580.159.04, 1980 MHz, 143771 MiB",
        "- torch: 2.14.1",
        "- Python: 3.11.2",
        "- Percentile method: nearest",
        "| graph | 1.50 |",
    ):
        assert expected in rendered[0]
    for expected in ("- GPU: NVIDIA H100", "- torch: 2.11.0", "- Python: 3.11.1"):
        assert expected in rendered[1]
    assert "Percentile method" not in rendered[1]


def test_unknown_file_is_skipped_with_a_note(tmp_path: Path) -> None:
    unknown = _write(tmp_path, {"hello": 1}, stem="unknown")
    listed = _write(tmp_path, [1, 2, 3], stem="a-list")
    known = _write(tmp_path, streams_result())
    report = write_report([unknown, listed, known], tmp_path / "out")
    assert len(report.notes) == 2 and "unknown.json" in report.notes[0]
    assert not (tmp_path / "out" / "unknown.md").exists()
    assert (tmp_path / "out" / f"{STEM}.md").is_file()


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    streams = _write(tmp_path, streams_result())
    unknown = _write(tmp_path, {"hello": 1}, stem="unknown")
    out = tmp_path / "out"
    assert main([str(streams), str(unknown), "--out-dir", str(out)]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert printed["written"][0] == str(out / f"{STEM}.md")
    assert len(printed["written"]) == 4
    assert "unknown.json" in captured.err
    _assert_png(out / f"{STEM}-streams_scaling.png")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out-dir", "OUT"], "no result files"),
        (["IN"], "--out-dir is required"),
        (["MISSING", "--out-dir", "OUT"], "cannot read"),
        (["BAD", "--out-dir", "OUT"], "not JSON"),
    ],
)
def test_command_line_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "BAD").write_text("{not json")
    (tmp_path / "IN").write_text("{}")
    argv = [str(tmp_path / a) if a.isupper() else a for a in argv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "OUT").exists()


def test_without_matplotlib_markdown_is_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    report = write_report([_write(tmp_path, streams_result())], tmp_path / "out")
    assert [p.name for p in report.written] == [f"{STEM}.md"]
    assert "no plots" in report.notes[0]
    assert "## Plots" not in report.written[0].read_text()
