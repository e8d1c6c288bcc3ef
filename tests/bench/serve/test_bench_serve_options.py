"""`vdet bench serve` arguments: variants to environment variables, and every refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from vdet.bench.serve.options import (
    ServeBenchUsageError,
    Variant,
    options_from_args,
    parse_streams,
    parse_variant,
)
from vdet.cli.main import build_parser, main


def test_a_variant_turns_settings_into_vdet_variables_and_passes_env_as_is() -> None:
    variant = parse_variant("workers8:workers.per_gpu=8 gpu.batch=8 CUDA_VISIBLE_DEVICES=0,1")
    assert variant == Variant(
        "workers8",
        {"workers.per_gpu": "8", "gpu.batch": "8"},
        {"CUDA_VISIBLE_DEVICES": "0,1"},
    )
    assert variant.environment() == {
        "VDET_WORKERS__PER_GPU": "8",
        "VDET_GPU__BATCH": "8",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }


def test_an_empty_variant_is_todays_serve() -> None:
    assert parse_variant("one-process:") == Variant("one-process")
    assert Variant("one-process").environment() == {}


def test_stream_counts_keep_their_order() -> None:
    assert parse_streams("8,16, 32,64") == (8, 16, 32, 64)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--streams", "a,b"], "--streams must be comma-separated integers"),
        (["--streams", ","], "at least one stream count"),
        (["--streams", "0"], "each count must be 1..1024"),
        (["--streams", "2,2"], "is repeated"),
        (["--duration", "0"], "--duration must be > 0"),
        (["--warmup-seconds", "-1"], "--warmup-seconds must be >= 0"),
        (["--control-interval", "0"], "--control-interval must be > 0"),
        (["--clients", "0"], "--clients must be 1..64"),
        (["--pipeline-frames", "-1"], "--pipeline-frames must be 0..100000"),
        (["--variant", "no-colon"], "expected NAME:[key=value ...]"),
        (["--variant", "bad name:"], "the name must be"),
        (["--variant", "v:gpu.batch"], "is not key=value"),
        (["--variant", "v:Gpu.Batch=8"], "neither a settings key"),
        (["--variant", "v:gpu.batch=1 gpu.batch=2"], "is given twice"),
        (["--variant", "a:", "--variant", "a:gpu.batch=8"], "names must be distinct"),
        (["--clip", "/nonexistent/clip.mp4"], "--clip: no such file"),
        (["--model", "/nonexistent/model.onnx"], "--model: no such file"),
        (["--kill-worker-after", "0"], "--kill-worker-after must be inside the measured window"),
        (["--duration", "5", "--kill-worker-after", "5"], "(0 < s < --duration 5), got 5"),
        (["--kill-worker-streams", "2"], "--kill-worker-streams needs --kill-worker-after"),
        (
            ["--streams", "16,64", "--kill-worker-after", "3", "--kill-worker-streams", "32"],
            "--kill-worker-streams: [32] not among --streams [16, 64]",
        ),
        (
            ["--kill-worker-after", "3", "--kill-worker-streams", "x"],
            "--kill-worker-streams must be comma-separated integers",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line_and_start_nothing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vdet bench serve: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_errors_name_the_variant(tmp_path: Path) -> None:
    with pytest.raises(ServeBenchUsageError, match="--variant w8: 'x' is not key=value"):
        parse_variant("w8:x")


def test_a_kill_applies_to_every_step_unless_steps_are_named() -> None:
    parser = build_parser()
    argv = ["bench", "serve", "--streams", "16,64", "--kill-worker-after", "3"]
    every = options_from_args(parser.parse_args(argv))
    assert every.kill_worker_after_s == 3.0 and every.kill_worker_streams == (16, 64)
    named = options_from_args(parser.parse_args([*argv, "--kill-worker-streams", "64"]))
    assert named.kill_worker_streams == (64,)
    assert options_from_args(parser.parse_args(argv[:4])).kill_worker_after_s is None
