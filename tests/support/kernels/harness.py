"""The kernel test harness: where a kernel runs ("cuda" on the GPU, "emu" on the CPU emulator).

Test modules import these names from here (`gpu_harness`), not from `conftest`: several test
folders have a conftest module and only one of them can be `conftest` in `sys.modules`.
"""

from __future__ import annotations

import importlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.kernels.emulator import EmuBackend, build_emulator, compiler
from vdet.core.assets import asset_path
from vdet.cuda.launch import CudaUnavailableError
from vdet.cuda.ops import GpuOps

SAMPLE_CLIP = asset_path("sample.mp4")
DEMO_MODEL = asset_path("demo.onnx")


@dataclass
class Harness:
    """One place the kernels run: "cuda" (torch tensors) or "emu" (NumPy arrays)."""

    kind: str
    ops: GpuOps
    stream: Any = None
    torch: Any = field(default=None, repr=False)

    def put(self, array: np.ndarray) -> Any:
        array = np.ascontiguousarray(array)
        if self.torch is None:
            return array.copy()
        tensor = self.torch.from_numpy(array).to("cuda")
        self.torch.cuda.synchronize()
        return tensor

    def full(self, shape: tuple[int, ...], value: float, dtype: type[np.generic]) -> Any:
        """An output buffer filled with a poison value, so unwritten elements show."""
        return self.put(np.full(shape, value, dtype))

    def get(self, tensor: Any) -> np.ndarray:
        self.sync()
        if self.torch is None:
            return np.asarray(tensor)
        return np.asarray(tensor.cpu().numpy())

    def sync(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


def _cuda_harness() -> Harness:
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        pytest.skip("torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        ops = GpuOps()
    except CudaUnavailableError as exc:
        pytest.skip(str(exc))
    torch.cuda.init()
    return Harness("cuda", ops, stream=torch.cuda.Stream(), torch=torch)


def _emu_harness() -> Harness:
    if compiler() is None:
        pytest.skip("g++ is needed for the kernel emulator")
    library = build_emulator(Path(tempfile.gettempdir()) / "vdet-emu")
    # A shuffled thread and block order: results must not depend on either.
    return Harness("emu", GpuOps(EmuBackend(library, seed=12345)))
