"""`vdet bench serve --find-ceiling`: the steps it takes, when a step does not hold, and a real
run on the CPU that stops at its first failing step with the decode-only ceiling beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.videos import write_h264_clip

from vdet.bench.serve.options import ServeBenchUsageError, options_from_args
from vdet.bench.serve.results import LatencyMs, ServeBenchResult, StepResult
from vdet.bench.serve.runner import ceiling_failure, ceiling_of
from vdet.cli.main import build_parser, main


def _options(*argv: str) -> Any:
    return options_from_args(build_parser().parse_args(["bench", "serve", *argv]))


def test_the_ceiling_steps_by_step_up_to_the_most() -> None:
    opts = _options("--find-ceiling", "--step", "16", "--max-streams", "64")
    assert opts.streams == (16, 32, 48, 64) and opts.p99_limit_ms == 50.0
    assert opts.decode_ceiling_s == 10.0
    assert _options("--streams", "4").decode_ceiling_s == 0.0  # only with --find-ceiling
    with pytest.raises(ServeBenchUsageError, match="drop --unpaced"):
        _options("--find-ceiling", "--unpaced")
    with pytest.raises(ServeBenchUsageError, match="--step must be"):
        _options("--find-ceiling", "--step", "32", "--max-streams", "16")
    # A node known to hold 96 starts the search above it.
    high = _options("--find-ceiling", "--min-streams", "112", "--max-streams", "192")
    assert high.streams == (112, 128, 144, 160, 176, 192)
    with pytest.raises(ServeBenchUsageError, match="--min-streams"):
        _options("--find-ceiling", "--min-streams", "200", "--max-streams", "192")


def _step(streams: int, **fields: Any) -> StepResult:
    p99 = fields.pop("p99", 20.0)
    base: dict[str, Any] = {
        "streams": streams,
        "error": None,
        "all_publishing": True,
        "real_time": True,
        "results_per_s": 30.0 * streams,
        "expected_results_per_s": 30.0 * streams,
        "dropped": 0,
        "server_dropped": 0.0,
        "latency_ms": LatencyMs(p50=10, p90=15, p99=p99, max=p99, mean=11, n=100),
    }
    return StepResult.model_construct(**{**base, **fields})


def test_a_step_holds_only_real_time_without_drops_within_the_bound() -> None:
    assert ceiling_failure(_step(16), 50) is None
    assert "below real time" in (ceiling_failure(_step(16, real_time=False), 50) or "")
    assert ceiling_failure(_step(16, server_dropped=3.0), 50) == "3 frames dropped"
    assert ceiling_failure(_step(16, p99=51.5), 50) == "p99 51.5 ms over 50 ms"
    assert ceiling_failure(_step(16, all_publishing=False), 50) == "not every stream published"
    assert ceiling_failure(_step(16, error="only 3 of 16 added\nmore"), 50) == "only 3 of 16 added"
    both = ceiling_failure(_step(16, server_dropped=1.0, p99=60.0), 50)
    assert both == "1 frames dropped; p99 60 ms over 50 ms"


def test_the_ceiling_is_the_last_step_before_the_first_failure() -> None:
    opts = _options("--find-ceiling", "--step", "16", "--max-streams", "64")
    ceiling = ceiling_of([_step(16), _step(32), _step(48, p99=80.0)], opts)
    assert (ceiling.streams, ceiling.stopped_at) == (32, 48)
    assert ceiling.stopped_by == "p99 80 ms over 50 ms"
    assert ceiling_of([_step(16), _step(32)], opts).stopped_at is None
    assert ceiling_of([_step(16, dropped=1)], opts).streams is None


@pytest.mark.slow
def test_a_real_run_stops_at_its_first_failing_step_beside_the_decode_ceiling(
    tmp_path: Path,
) -> None:
    clip = write_h264_clip(tmp_path / "clip.mp4", seconds=2.0, size_wh=(320, 180))
    out = tmp_path / "ceiling.json"
    argv = ["bench", "serve", "--find-ceiling", "--step", "1", "--max-streams", "3"]
    argv += ["--p99-ms", "1", "--decode-seconds", "2", "--duration", "2"]
    argv += ["--warmup-seconds", "0.5", "--clip", str(clip), "--backend", "onnxruntime"]
    argv += ["--output", str(out), "--control-interval", "0.2"]
    assert main(argv) == 0
    result = ServeBenchResult.model_validate_json(out.read_text())
    assert result.options.find_ceiling and result.options.p99_limit_ms == 1.0
    (variant,) = result.variants
    ceiling = variant.ceiling
    # No server answers within 1 ms: the first step fails and the run stops there.
    assert ceiling is not None and ceiling.streams is None and ceiling.stopped_at == 1
    assert "over 1 ms" in (ceiling.stopped_by or "") and len(variant.steps) == 1
    decode = result.decode_ceiling
    assert decode is not None and decode.error is None and decode.decode_path == "cpu"
    assert decode.frames_per_s > 30 and decode.streams_equivalent is not None
