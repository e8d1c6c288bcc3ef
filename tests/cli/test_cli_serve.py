"""`vdet serve` refuses to start with a clear one-line reason, not a traceback, when a
configured source or the streams file cannot be used."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.serve import vdet_command


def _serve(tmp_path: Path, config: dict[str, object]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "vdet.yaml"
    path.write_text(yaml.safe_dump({"port": 1, **config}))
    return subprocess.run(
        [vdet_command(), "serve", "--no-demo", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    ("config", "streams_file", "reason"),
    [
        (
            {
                "sources": [{"id": "cam", "url": "rtsp://10.0.0.7/s?password=hunter22"}],
                "ingest": {"source_policy": {"hosts": ["127.0.0.1"]}},
            },
            None,
            "configured source 'cam' (sources[0].url): source host '10.0.0.7' is not allowed",
        ),
        (
            {"sources": [{"id": "a", "url": "/etc/hostname"}]},
            None,
            "source file /etc/hostname is outside ingest.source_policy.file_roots",
        ),
        (
            {"sources": [{"id": "a", "url": "ftp://x.example/v"}]},
            None,
            "configured source 'a' (sources[0].url): unsupported source scheme 'ftp'",
        ),
        (
            {
                "sources": [{"id": "a", "url": "http://x.example/v"}],
                "ingest": {"source_policy": {"schemes": ["rtsp"]}},
            },
            None,
            "is not allowed on this server; use rtsp:// (ingest.source_policy.schemes)",
        ),
        ({"streams_file": "streams.json"}, '{"version": 1, "streams": [', "invalid streams file"),
        ({"streams_file": "streams.json"}, '{"version": 9, "streams": []}', "streams file"),
    ],
    ids=[
        "source-off-policy",
        "file-outside-roots",
        "scheme-unknown",
        "scheme-off-policy",
        "streams-file-cut",
        "streams-file-version",
    ],
)
def test_a_bad_source_or_streams_file_stops_start_up_in_one_line(
    tmp_path: Path, config: dict[str, object], streams_file: str | None, reason: str
) -> None:
    if streams_file is not None:
        (tmp_path / "streams.json").write_text(streams_file)
    done = _serve(tmp_path, config)
    assert done.returncode == 2, done.stderr
    assert reason in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "hunter22" not in done.stderr


def test_a_start_up_that_fails_in_the_app_is_a_few_lines_without_a_traceback(
    tmp_path: Path,
) -> None:
    """A model file that is no model fails while the app starts (inside uvicorn's lifespan),
    after the checks before it: said in a few lines, the traceback only at debug level."""
    (tmp_path / "model.onnx").write_text("not a model\n")
    done = _serve(tmp_path, {"model_path": str(tmp_path / "model.onnx")})
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert "Traceback" not in done.stderr and len(errors) <= 3, done.stderr
    assert any("model.onnx" in line for line in errors), done.stderr
