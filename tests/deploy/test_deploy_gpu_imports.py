"""deploy/Dockerfile.gpu provides every import of the GPU data path, checked statically.

No Docker engine here, so the image is never built: instead its install line is read, the
distributions it brings are closed over their dependencies (pyproject.toml and the installed
packages' metadata), and every third-party import that `vdet serve`'s GPU path can reach (walked
from the source with ast, function-level imports included) must come from one of them. The
Dockerfile also imports the same libraries at build time, so a real build fails where this
reading would be wrong.
"""

from __future__ import annotations

import re

import pytest
from support.dockerfiles import instructions, stage_count
from support.import_closure import (
    distributions_of,
    pip_install_targets,
    provided_distributions,
    third_party_imports,
    vdet_requirements,
)
from support.tools import REPO

from vdet.tensorrt.library import TENSORRT_RTX

GPU_DOCKERFILE = REPO / "deploy/Dockerfile.gpu"

# `vdet serve` on a GPU: the app, the GPU devices (NVDEC readers, CUDA-graph runners, our
# kernels), both GPU backends, and the engine builder they call (fp16 through AutoCast).
GPU_PATH = (
    "vdet.cli.main",
    "vdet.api.app",
    "vdet.gpu.devices",
    "vdet.ingest.nvdec_reader",
    "vdet.inference.backends.torch",
    "vdet.inference.backends.tensorrt",
    "vdet.cuda.launch",
    "vdet.tensorrt.build",
    "vdet.modelkit.quantize",
)
# Reached through `vdet.cli` but never by `vdet serve`: other commands' optional libraries.
NOT_SERVING = {
    "ultralytics",  # vdet export / train (the train extra)
    "motmetrics",  # vdet eval --track (the eval extra)
    "supervision",  # vdet bench tracking's optional peer
    "trackers",  # vdet bench tracking's optional peer
    "websockets",  # vdet bench serve's WebSocket clients (the bench extra)
}


def _build_run() -> str:
    items = instructions(GPU_DOCKERFILE)
    runs = [i.value for i in items if i.keyword == "RUN" and "pip install" in i.value]
    assert len(runs) == 1, runs
    return runs[0]


def missing_imports(run: str) -> dict[str, set[str]]:
    """Third-party imports of the GPU path that the install line in `run` does not provide."""
    extras, packages = pip_install_targets(run)
    provided = provided_distributions(vdet_requirements(extras) | packages)
    imported = third_party_imports(GPU_PATH)
    # vdet.tensorrt.library imports the engine library by the name it holds, not a literal.
    imported.setdefault(TENSORRT_RTX.module, set()).add("vdet.tensorrt.library")
    missing = {}
    for name, importers in imported.items():
        if name in NOT_SERVING:
            continue
        if not distributions_of(name) & provided:
            missing[name] = importers
    return missing


def test_the_install_line_provides_every_import_of_the_gpu_path() -> None:
    run = _build_run()
    extras, packages = pip_install_targets(run)
    assert {"gpu", "tensorrt-rtx", "quant"} <= extras and "torch" in packages
    assert missing_imports(run) == {}


def test_the_gpu_libraries_are_imported_at_build_time_too() -> None:
    """The build's own import check names every library that only the GPU extras bring."""
    run = _build_run()
    check = " ".join(re.findall(r'python -c "([^"]*)"', run))
    for name in ("torch", "onnx2torch", "PyNvVideoCodec", "tensorrt_rtx_bindings", "modelopt"):
        assert re.search(rf"\b{name}\b", check), name
    assert "from cuda.bindings import driver, nvrtc, runtime" in check
    imported = third_party_imports(GPU_PATH)
    for name in ("torch", "onnx2torch", "PyNvVideoCodec", "cuda", "tensorrt_rtx_bindings"):
        if name != "tensorrt_rtx_bindings":  # loaded by name through vdet.tensorrt.library
            assert name in imported, f"the GPU path no longer imports {name}?"


@pytest.mark.parametrize(
    ("edit", "lost"),
    [
        (
            lambda run: run.replace(".[gpu,tensorrt-rtx,quant]", ".[tensorrt-rtx,quant]"),
            "PyNvVideoCodec",
        ),
        (
            lambda run: run.replace(".[gpu,tensorrt-rtx,quant]", ".[gpu,quant]"),
            "tensorrt_rtx_bindings",
        ),
        (lambda run: run.replace(".[gpu,tensorrt-rtx,quant]", ".[gpu,tensorrt-rtx]"), "modelopt"),
    ],
)
def test_the_check_bites_when_the_install_line_loses_a_part(edit: object, lost: str) -> None:
    run = _build_run()
    edited = edit(run)  # type: ignore[operator]
    assert edited != run
    assert lost in missing_imports(edited)


def test_the_image_is_a_slim_python_with_one_install_line() -> None:
    items = instructions(GPU_DOCKERFILE)
    assert stage_count(items) == 2
    args = [i.value for i in items if i.keyword == "ARG"]
    assert args[0] == "PYTHON_IMAGE=python:3.11-slim-bookworm"
    setup = (REPO / "scripts/setup.sh").read_text()
    (torch_pin,) = re.findall(r'"torch==([^"]+)"', setup)
    assert f"TORCH_VERSION={torch_pin}" in args, "the image runs the torch the tests run"
