"""A fleet node's NATS connection with the server's TLS and token: a real nats-server that
requires both, real `vdet serve` processes. The node joins with the right settings; with a
wrong token or without the server's CA it does not start, says why, and never shows the
token."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.apptest import write_tiny_model
from support.nats_servers import nats_server_binary, single_server
from support.rtsp import free_port
from support.serve import start_service, vdet_command
from support.tls import self_signed_ca

pytestmark = pytest.mark.slow

TOKEN = "fleet-s3cret-t0ken"


def test_a_node_joins_a_fleet_that_requires_tls_and_a_token(tmp_path: Path) -> None:
    nats_server_binary()
    ca, cert, key = self_signed_ca(tmp_path)
    server = single_server(
        tmp_path / "nats",
        extra_config=[
            f'authorization {{ token: "{TOKEN}" }}',
            f'tls {{ cert_file: "{cert}", key_file: "{key}" }}',
        ],
    )
    model = write_tiny_model(tmp_path / "tiny.onnx")
    url = f"tls://127.0.0.1:{server.port}"
    good = {"servers": [url], "node_id": "a", "token": TOKEN, "tls_ca_file": str(ca)}
    try:
        svc = start_service(tmp_path, model, cluster=good)
        try:
            status, body = svc.get("/v1/nodes")
            assert status == 200 and [n["id"] for n in body["nodes"]] == ["a"]
            assert TOKEN not in svc.process.log_path.read_text()
        finally:
            svc.process.stop()
        for name, cluster, why in [
            ("wrong token", {**good, "token": "not-the-token"}, "authorization"),
            ("no CA", {k: v for k, v in good.items() if k != "tls_ca_file"}, "certificate"),
        ]:
            config_path = tmp_path / f"{name.replace(' ', '-')}.yaml"
            config_path.write_text(
                yaml.safe_dump(
                    {
                        "port": free_port(),
                        "model_path": str(model),
                        "backend": "onnxruntime",
                        "cluster": {**cluster, "connect_timeout_s": 2.0},
                    }
                )
            )
            done = subprocess.run(
                [vdet_command(), "serve", "--no-demo", "--config", str(config_path)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            output = done.stdout + done.stderr
            assert done.returncode != 0, f"{name}: started\n{output[-2000:]}"
            assert why in output.lower(), f"{name}:\n{output[-2000:]}"
            assert "accepted this node within" in output, f"{name}: the start's last word"
            assert TOKEN not in output and "not-the-token" not in output, name
    finally:
        server.stop()
