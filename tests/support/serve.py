"""A real `vdet serve` for tests: started through the installed entry point with a generated
config file, a small HTTP client for it, and process checks (for worker processes)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from support.procs import Process, http_get, http_json, wait_http_ok
from support.rtsp import free_port


def vdet_command() -> str:
    """The installed `vdet` console script: beside this interpreter (a venv), else on PATH (a
    `pip install --target` tree with its bin folder on PATH)."""
    beside = Path(sys.executable).parent / "vdet"
    if beside.exists():
        return str(beside)
    found = shutil.which("vdet")
    if found is None:
        raise FileNotFoundError("the vdet console script is neither beside python nor on PATH")
    return found


class Service:
    """A running `vdet serve` and a small HTTP client for it."""

    def __init__(self, process: Process, port: int) -> None:
        self.process = process
        self.base = f"http://127.0.0.1:{port}"
        self.ws_base = f"ws://127.0.0.1:{port}"

    def get(self, path: str) -> tuple[int, Any]:
        status, body = http_get(self.base + path, timeout=10)
        return status, (json.loads(body) if body and status != 204 else None)

    def send(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return int(response.status), (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as exc:
            return int(exc.code), json.loads(exc.read() or b"null")

    def workers(self) -> list[dict[str, Any]]:
        return list(http_json(self.base + "/v1/workers")["workers"])

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, body = http_get(self.base + "/metrics", timeout=10)
        assert status == 200
        out = {}
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def processed(self, source: str) -> float:
        return self.metrics().get(("vdet_frames_processed_total", (("source", source),)), 0.0)


def start_service(
    folder: Path, model: Path, *, ready_timeout: float = 120, **settings: Any
) -> Service:
    """`vdet serve --no-demo` on `model` (onnxruntime unless `settings` say otherwise), ready;
    files under `folder` are allowed sources."""
    port = free_port()
    config = {
        "host": "127.0.0.1",
        "port": port,
        "model_path": str(model),
        "backend": "onnxruntime",
        "max_streams": 6,
        "log_level": "info",
        "ingest": {
            "stall_timeout_s": 3.0,
            "backoff_initial_s": 0.1,
            "backoff_max_s": 0.5,
            # The test's own clips are written there; the source policy allows no other files.
            "source_policy": {"file_roots": [str(folder)]},
        },
        **settings,
    }
    path = folder / f"vdet-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
    process = Process(
        [vdet_command(), "serve", "--no-demo", "--config", str(path)],
        folder / f"vdet-{port}.log",
        env=env,
    )
    service = Service(process, port)
    try:
        wait_http_ok(process, service.base + "/readyz", timeout=ready_timeout)
    except BaseException:
        process.stop()
        raise
    return service


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
