"""Fixtures for the CUDA kernel tests.

`harness` runs each kernel test twice: on the GPU (`[cuda]`, marked `gpu`, skipped without a
CUDA device, torch or cuda-python) and on the CPU emulator (`[emu]`, skipped without g++),
with the same test body. A harness moves NumPy arrays to its "device" and back, so the tests
compare against the NumPy/OpenCV references in one place (`gpu_harness`).
"""

from __future__ import annotations

import pytest
from support.kernels.harness import Harness, _cuda_harness, _emu_harness


@pytest.fixture(
    scope="session",
    params=[pytest.param("cuda", marks=pytest.mark.gpu), "emu"],
)
def harness(request: pytest.FixtureRequest) -> Harness:
    return _cuda_harness() if request.param == "cuda" else _emu_harness()


@pytest.fixture(scope="session")
def cuda_harness() -> Harness:
    """The GPU alone, for tests that only make sense there (graphs, streams)."""
    return _cuda_harness()
