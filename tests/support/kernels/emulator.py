"""A `vdet.cuda.launch.Backend` that runs the CUDA kernels on the CPU, for tests.

`build_emulator` compiles service/vdet/cuda/kernels/*.cu with g++ against
tests/support/kernels/emu/emu.h
(a fiber-per-thread emulation of blocks, barriers and warp intrinsics) into a shared library;
`EmuBackend` launches through it with the same arguments the CUDA backend passes to
cuLaunchKernel. "Device" memory is host memory: tensors are NumPy arrays. Scratch allocations
carry guard bytes on both sides, checked when freed, so an out-of-bounds write into them fails
the test. Shuffled thread and block orders (a non-zero seed) expose missing barriers and
order-dependent results.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vdet.cuda.launch import (
    KERNEL_DIR,
    DeviceArray,
    Dim3,
    KernelArg,
    device_array,
    kernel_sources,
    pack_args,
)

EMULATOR_DIR = Path(__file__).with_name("emu")
GUARD = 4096
# What an H200 allows one block after opting in (cudaDevAttrMaxSharedMemoryPerBlockOptin).
H200_MAX_SHARED = 232448


def compiler() -> str | None:
    return shutil.which("g++")


def build_emulator(cache_dir: Path) -> Path:
    """Compile the emulator library (cached by a hash of every source it is built from)."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("g++ is needed to build the kernel emulator")
    digest = hashlib.sha256()
    sources = kernel_sources() | {
        p.name: p.read_text() for p in sorted(EMULATOR_DIR.iterdir()) if p.suffix in (".h", ".cpp")
    }
    for name, text in sorted(sources.items()):
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    library = cache_dir / f"vdet-emu-{digest.hexdigest()[:24]}.so"
    if not library.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = library.with_suffix(".tmp.so")
        command = [
            cxx, "-std=c++17", "-O2", "-g", "-fPIC", "-shared", "-ffp-contract=off",
            "-fno-fast-math", "-Wall", "-Wextra", "-Wno-unknown-pragmas", "-Werror",
            f"-I{KERNEL_DIR}", f"-I{EMULATOR_DIR}", "-include", "emu.h",
            str(EMULATOR_DIR / "emu.cpp"), "-o", str(tmp),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"building the emulator failed:\n{result.stderr}")
        tmp.replace(library)
    return library


class EmuBackend:
    """Kernels on the CPU through the emulator library; tensors are NumPy arrays."""

    def __init__(self, library: Path, *, seed: int = 0) -> None:
        self._lib = ctypes.CDLL(str(library))
        self._lib.emu_launch.restype = ctypes.c_int
        self._lib.emu_launch.argtypes = [
            ctypes.c_char_p, *([ctypes.c_uint] * 7), ctypes.c_void_p, ctypes.c_uint,
            ctypes.c_char_p, ctypes.c_int,
        ]  # fmt: skip
        self.seed = seed
        self.launches: list[tuple[str, Dim3, Dim3, int]] = []
        self._allocations: dict[int, np.ndarray] = {}

    @property
    def max_shared_bytes(self) -> int:
        return H200_MAX_SHARED

    def array(self, obj: object) -> DeviceArray:
        return device_array(obj, allow_host=True)

    def launch(
        self,
        kernel: str,
        grid: Dim3,
        block: Dim3,
        shared_bytes: int,
        stream: int,
        args: Sequence[KernelArg],
    ) -> None:
        if shared_bytes > self.max_shared_bytes:
            raise RuntimeError(f"{kernel}: {shared_bytes} bytes of shared memory is too much")
        self.launches.append((kernel, grid, block, shared_bytes))
        params = pack_args(args)
        error = ctypes.create_string_buffer(1024)
        status = self._lib.emu_launch(
            kernel.encode(), *grid, *block, shared_bytes, ctypes.addressof(params), self.seed,
            error, len(error),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"{kernel}: {error.value.decode()}")

    def memset_u32(self, ptr: int, value: int, count: int, stream: int) -> None:
        words = (ctypes.c_uint32 * count).from_address(ptr)
        for i in range(count):
            words[i] = value

    def alloc(self, nbytes: int, stream: int) -> int:
        buffer = np.full(nbytes + 2 * GUARD, 0xC3, np.uint8)
        ptr = int(buffer.ctypes.data) + GUARD
        self._allocations[ptr] = buffer
        return ptr

    def free(self, ptr: int, stream: int) -> None:
        buffer = self._allocations.pop(ptr)
        if (buffer[:GUARD] != 0xC3).any() or (buffer[-GUARD:] != 0xC3).any():
            raise RuntimeError("a kernel wrote outside its scratch allocation")
