"""TLS for tests of clients vdet makes (MQTT, webhooks): a CA of the test's own, made with
openssl, and the certificate it signs for 127.0.0.1."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.tools import require_tool


def self_signed_ca(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, a certificate it signed for 127.0.0.1, that certificate's key), made
    with openssl in `folder`."""
    openssl = require_tool("openssl", provided_by="Debian package openssl")
    ca_key, ca, key, csr, cert = (
        folder / name for name in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem")
    )
    run = [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    subprocess.run(
        [*run, "-keyout", str(ca_key), "-out", str(ca), "-subj", "/CN=vdet test CA"],
        check=True,
        capture_output=True,
    )
    request = [openssl, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"]
    subprocess.run(
        [*request, "-keyout", str(key), "-out", str(csr)], check=True, capture_output=True
    )
    extensions = folder / "server.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1\n")
    sign = [openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)]
    subprocess.run(
        [*sign, "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(extensions)],
        check=True,
        capture_output=True,
    )
    return ca, cert, key
