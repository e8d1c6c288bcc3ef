"""`vdet bench serve` on a GPU: a real `vdet serve` on the torch backend (NVDEC, CUDA graphs)
with 1 and 8 paced 1080p30 streams of the sample clip and two WebSocket clients.

8 streams are well inside what one process carries (bench/results/report/2026-12-03-streams-h200.md:
8 paced streams per process, 0 dropped), so every step must hold real time; the GPU figures
(devices, memory per stream) must be there. Needs a CUDA GPU, torch and nvidia-smi.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
    pytest.skip("needs a CUDA GPU and nvidia-smi", allow_module_level=True)

from vdet.bench.serve.results import ServeBenchResult  # noqa: E402
from vdet.cli.main import main  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_eight_streams_hold_real_time_through_the_api(tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--backend", "torch", "--streams", "1,8", "--duration", "5"]
    argv += ["--clients", "2", "--output", str(out)]
    assert main(argv) == 0
    result = ServeBenchResult.model_validate_json(out.read_text())
    assert result.machine.gpus
    (variant,) = result.variants
    assert variant.error is None and variant.exit is not None and variant.exit.orphans == []
    for step in variant.steps:
        assert step.real_time, step.model_dump_json(exclude={"clients"})
        assert step.latency_ms is not None and step.latency_ms.p99 <= 50.0
        assert step.gpu is not None and step.gpu.used_mib_per_stream > 0
        assert not step.bench_client.client_bound
