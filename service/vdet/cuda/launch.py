"""Compile, load and launch the CUDA kernels of vdet/cuda/kernels/ through cuda-python.

This module owns the mechanics between Python and the GPU: reading the kernel sources, NVRTC
compilation for the current GPU (cubins cached on disk, keyed by the sources, options, target
and NVRTC version), loading modules into the device's primary context (the one PyTorch and CuPy
use), packing arguments, launching on a caller's stream, stream-ordered scratch memory, and
turning every CUDA and NVRTC status into an exception that names the error. It does not know
what the kernels compute: `vdet.cuda.ops` does, and is what callers use.

Importing it needs neither a GPU nor cuda-python; using a GPU part without them raises
`CudaUnavailableError`. The `Backend` protocol is the seam that lets tests run the same launch
code against a CPU emulation of the kernels (tests/support/kernels/emulator.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vdet.core.extras import needs_extra

# Package data of vdet (vdet/cuda/kernels/), beside this sub-package.
KERNEL_DIR = Path(__file__).resolve().parent / "kernels"

# Translation units (one CUDA module each) and the headers they may include.
MODULE_SOURCES: Mapping[str, str] = {
    "preprocess": "preprocess.cu",
    "decode_nms": "decode_nms.cu",
    "layers": "layers.cu",
}
KERNEL_SUFFIXES = (".cu", ".cuh", ".h")

# Exactness before speed: no FMA contraction, IEEE division and square root, no flush to zero
# (docs/conventions.md). NVRTC has no -O flag (it always optimises); ptxas gets -O3 explicitly.
NVRTC_OPTIONS: tuple[str, ...] = (
    "--std=c++17",
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
    "--ptxas-options=-O3",
    "-lineinfo",
)

# Bump when the cache's file format or naming changes.
CACHE_FORMAT = 1

KernelArg = ctypes.c_int | ctypes.c_uint | ctypes.c_float | ctypes.c_uint64 | ctypes.Structure


class KernelError(RuntimeError):
    """A CUDA driver or NVRTC call failed; the message names the call and the error."""


class CudaUnavailableError(KernelError):
    """cuda-python, the NVIDIA driver or a GPU is missing where a GPU operation was asked for."""


# ---- status checks ------------------------------------------------------------------------


def _error_name(status: Any) -> str:
    """The symbolic name of a CUresult or nvrtcResult (falls back to the enum's own name)."""
    try:
        from cuda.bindings import driver, nvrtc

        if isinstance(status, driver.CUresult):
            err, name = driver.cuGetErrorName(status)
            if err == driver.CUresult.CUDA_SUCCESS:
                return bytes(name).decode()
        if isinstance(status, nvrtc.nvrtcResult):
            err, name = nvrtc.nvrtcGetErrorString(status)
            if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
                return bytes(name).decode()
    except Exception:  # naming an error must never hide the error itself
        pass
    return str(getattr(status, "name", status))


def check(result: Any, what: str) -> Any:
    """Check one cuda-python call's result tuple (status, *values); return the value(s).

    Every driver and NVRTC call in vdet goes through here. Raises `KernelError` naming `what`
    and the error (e.g. ``cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE``).
    """
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise KernelError(f"{what} failed: {_error_name(status)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _bindings() -> tuple[Any, Any]:
    """(driver, nvrtc) from cuda-python, or CudaUnavailableError saying how to get them."""
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError as exc:
        raise CudaUnavailableError(
            needs_extra("the GPU kernels (cuda-python, cuda-bindings 13.x)", "gpu")
        ) from exc
    return driver, nvrtc


# ---- sources, options and the cubin cache ---------------------------------------------------


def kernel_sources(directory: Path = KERNEL_DIR) -> dict[str, str]:
    """Every kernel source and header in `directory`, by file name."""
    if not directory.is_dir():
        raise KernelError(f"kernel sources not found in {directory}")
    return {
        path.name: path.read_text(encoding="utf-8")
        for path in sorted(directory.iterdir())
        if path.suffix in KERNEL_SUFFIXES
    }


def nvrtc_options(arch: str, include_dir: Path = KERNEL_DIR) -> list[str]:
    """The full NVRTC option list for a target such as ``sm_90`` (or ``compute_90`` for PTX)."""
    return [f"--gpu-architecture={arch}", f"--include-path={include_dir}", *NVRTC_OPTIONS]


def cache_key(
    module: str,
    sources: Mapping[str, str],
    arch: str,
    nvrtc_version: tuple[int, int],
    options: Sequence[str],
) -> str:
    """Hex digest naming one compiled module: any change to these gives a new cubin.

    The include path is left out of the options hashed (it is where the sources were, not what
    they say), so an installed copy and a checkout share cache entries.
    """
    digest = hashlib.sha256()
    parts = [
        f"format={CACHE_FORMAT}",
        f"module={module}",
        f"arch={arch}",
        f"nvrtc={nvrtc_version[0]}.{nvrtc_version[1]}",
        *(f"option={o}" for o in options if not o.startswith("--include-path=")),
    ]
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    for name in sorted(sources):
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(sources[name].encode())
        digest.update(b"\0")
    return digest.hexdigest()


# Where this process keeps compiled kernels: the setting `gpu.kernel_cache_dir`, applied once
# by the process that assembles the GPU path (vdet.root); None: the user's cache folder.
_cache_dir: Path | None = None


def use_cache_dir(folder: Path | None) -> None:
    """Keep this process's compiled kernels in `folder` (None: `default_cache_dir`'s default)."""
    global _cache_dir
    _cache_dir = folder


def default_cache_dir() -> Path:
    """The folder `use_cache_dir` named, else $XDG_CACHE_HOME/vdet/kernels, else
    ~/.cache/vdet/kernels."""
    if _cache_dir is not None:
        return _cache_dir
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vdet" / "kernels"


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class CompiledModule:
    """One module's machine code (a cubin, or PTX when NVRTC does not know the GPU)."""

    name: str
    arch: str
    image: bytes
    log: str
    from_cache: bool


def nvrtc_version() -> tuple[int, int]:
    _, nvrtc = _bindings()
    major, minor = check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


def pick_arch(major: int, minor: int, supported: Sequence[int]) -> str:
    """``sm_XY`` when NVRTC can build machine code for compute capability X.Y, else
    ``compute_NN`` PTX for the newest supported NN below it (the driver compiles that)."""
    cc = major * 10 + minor
    if cc in supported:
        return f"sm_{cc}"
    older = [a for a in supported if a < cc]
    if not older:
        raise KernelError(f"NVRTC supports none of compute capability <= {major}.{minor}")
    return f"compute_{max(older)}"


def _out_buffer(size: int) -> bytes:
    """A fresh, writable-by-NVRTC bytes object of at least `size` bytes.

    cuda-python's NVRTC getters write into the bytes object they are given. The idiom
    `b" " * size` returns the interned constant `b" "` itself when size is 1 (an empty log is
    one NUL byte), and NVRTC then overwrites that shared object: every `b" "` in the process
    becomes `b"\\x00"` (urllib's unquote("%20") started returning NUL). `bytes(n)` for n >= 1
    always allocates a new object; one spare byte keeps n >= 2.
    """
    return bytes(size + 1)


def compile_module(
    module: str,
    arch: str,
    *,
    cache_dir: Path | None = None,
    directory: Path = KERNEL_DIR,
) -> CompiledModule:
    """NVRTC-compile one module for `arch`, or take it from the cache."""
    _, nvrtc = _bindings()
    sources = kernel_sources(directory)
    unit = MODULE_SOURCES.get(module)
    if unit is None or unit not in sources:
        raise KernelError(f"unknown kernel module {module!r}")
    options = nvrtc_options(arch, directory)
    version = nvrtc_version()
    key = cache_key(module, sources, arch, version, options)
    suffix = "cubin" if arch.startswith("sm_") else "ptx"
    cached = (cache_dir or default_cache_dir()) / f"{module}-{arch}-{key[:40]}.{suffix}"
    if cached.is_file():
        return CompiledModule(module, arch, cached.read_bytes(), "", True)

    prog = check(
        nvrtc.nvrtcCreateProgram(sources[unit].encode(), unit.encode(), 0, [], []),
        "nvrtcCreateProgram",
    )
    try:
        encoded = [o.encode() for o in options]
        status = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        size = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buffer = _out_buffer(int(size))
        check(nvrtc.nvrtcGetProgramLog(prog, buffer), "nvrtcGetProgramLog")
        log = buffer.rstrip(b"\0 ").decode(errors="replace")
        if int(status[0]) != 0:
            raise KernelError(
                f"nvrtcCompileProgram failed for {unit} ({arch}): {_error_name(status[0])}\n{log}"
            )
        if suffix == "cubin":
            size = check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            image = _out_buffer(int(size))
            check(nvrtc.nvrtcGetCUBIN(prog, image), "nvrtcGetCUBIN")
            image = image[: int(size)]
        else:
            size = check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            image = _out_buffer(int(size))
            check(nvrtc.nvrtcGetPTX(prog, image), "nvrtcGetPTX")
            image = image[: int(size)]
    finally:
        check(nvrtc.nvrtcDestroyProgram(prog), "nvrtcDestroyProgram")
    # A read-only cache costs a compile per process, nothing else.
    with contextlib.suppress(OSError):
        _write_atomically(cached, image)
    return CompiledModule(module, arch, image, log, False)


# ---- arrays and streams ---------------------------------------------------------------------

_TORCH_DTYPES: dict[str, np.dtype[Any]] = {
    "torch.float32": np.dtype(np.float32),
    "torch.float16": np.dtype(np.float16),
    "torch.uint8": np.dtype(np.uint8),
    "torch.uint16": np.dtype(np.uint16),
    "torch.int32": np.dtype(np.int32),
    "torch.int64": np.dtype(np.int64),
}


@dataclass(frozen=True)
class DeviceArray:
    """What a kernel needs of a tensor: its address, shape, dtype and strides in bytes."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    strides: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def is_contiguous(self) -> bool:
        expected = self.dtype.itemsize
        for size, stride in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if size > 1 and stride != expected:
                return False
            expected *= size
        return True


def _from_interface(interface: Mapping[str, Any]) -> DeviceArray:
    shape = tuple(int(s) for s in interface["shape"])
    dtype = np.dtype(interface["typestr"])
    strides = interface.get("strides")
    if strides is None:
        step, computed = dtype.itemsize, []
        for size in reversed(shape):
            computed.append(step)
            step *= size
        strides = tuple(reversed(computed))
    return DeviceArray(int(interface["data"][0]), shape, dtype, tuple(int(s) for s in strides))


def device_array(obj: object, *, allow_host: bool = False) -> DeviceArray:
    """Describe a CUDA tensor: a torch tensor, or anything with ``__cuda_array_interface__``
    (CuPy, PyNvVideoCodec planes, Numba). With `allow_host`, NumPy arrays too (emulation)."""
    if isinstance(obj, DeviceArray):
        return obj
    if type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        tensor: Any = obj
        if not tensor.is_cuda and not allow_host:
            raise ValueError(f"expected a CUDA tensor, got one on {tensor.device}")
        dtype = _TORCH_DTYPES.get(str(tensor.dtype))
        if dtype is None:
            raise ValueError(f"unsupported tensor dtype {tensor.dtype}")
        return DeviceArray(
            int(tensor.data_ptr()),
            tuple(int(s) for s in tensor.shape),
            dtype,
            tuple(int(s) * dtype.itemsize for s in tensor.stride()),
        )
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is not None:
        return _from_interface(interface)
    if allow_host and isinstance(obj, np.ndarray):
        return _from_interface(obj.__array_interface__)
    raise ValueError(
        f"expected a CUDA tensor (torch, or an object with __cuda_array_interface__), "
        f"got {type(obj).__name__}"
    )


def stream_handle(stream: object) -> int:
    """A raw CUstream handle from an int, a torch stream (.cuda_stream), a CuPy stream (.ptr)
    or a cuda.core stream (__cuda_stream__); None is the legacy default stream (0)."""
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    for attribute in ("cuda_stream", "ptr"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    protocol = getattr(stream, "__cuda_stream__", None)
    if callable(protocol):
        _, handle = protocol()
        return int(handle)
    raise ValueError(f"cannot get a CUDA stream handle from {type(stream).__name__}")


# ---- backends -------------------------------------------------------------------------------

Dim3 = tuple[int, int, int]


class Backend(Protocol):
    """Where kernels run: the GPU (`CudaBackend`) or, in tests, a CPU emulation."""

    @property
    def max_shared_bytes(self) -> int:
        """Dynamic shared memory one block may have after opting in."""
        ...

    def array(self, obj: object) -> DeviceArray: ...

    def launch(
        self,
        kernel: str,
        grid: Dim3,
        block: Dim3,
        shared_bytes: int,
        stream: int,
        args: Sequence[KernelArg],
    ) -> None: ...

    def memset_u32(self, ptr: int, value: int, count: int, stream: int) -> None: ...

    def alloc(self, nbytes: int, stream: int) -> int: ...

    def free(self, ptr: int, stream: int) -> None: ...


def _kernel_module(kernel: str) -> str:
    if kernel.startswith("vdet_letterbox_"):
        return "preprocess"
    if kernel.startswith("vdet_layer_"):
        return "layers"
    return "decode_nms"


def pack_args(args: Sequence[KernelArg]) -> ctypes.Array[ctypes.c_void_p]:
    """The void** array cuLaunchKernel takes: one pointer to each argument's bytes."""
    return (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))


class CudaBackend:
    """The kernels on one GPU through the CUDA driver API (cuda-python).

    Modules are compiled on first use, for the device's compute capability. Calls may come
    from any thread: each makes the device's primary context current for its duration.
    """

    def __init__(self, device: int = 0, *, cache_dir: Path | None = None) -> None:
        driver, _ = _bindings()
        self._driver = driver
        self._cache_dir = cache_dir
        self._lock = threading.Lock()
        self._modules: dict[str, Any] = {}
        self._functions: dict[str, Any] = {}
        self._shared_opt_in: dict[str, int] = {}
        self.compiled: dict[str, CompiledModule] = {}
        try:
            check(driver.cuInit(0), "cuInit")
        except KernelError as exc:
            raise CudaUnavailableError(f"no usable CUDA device: {exc}") from exc
        except Exception as exc:  # cuda-python cannot find libcuda: no driver here
            raise CudaUnavailableError(f"no NVIDIA driver found: {exc}") from exc
        count = int(check(driver.cuDeviceGetCount(), "cuDeviceGetCount"))
        if not 0 <= device < count:
            raise CudaUnavailableError(f"CUDA device {device} requested, {count} present")
        self.device = device
        self._dev = check(driver.cuDeviceGet(device), "cuDeviceGet")
        attr = driver.CUdevice_attribute
        self.compute_capability = (
            int(self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)),
            int(self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        )
        self._max_shared = int(
            self._attribute(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        )
        self._context = check(
            driver.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain"
        )
        raw_name = bytes(check(driver.cuDeviceGetName(256, self._dev), "cuDeviceGetName"))
        self.name = raw_name.split(b"\0", 1)[0].decode(errors="replace")

    def _attribute(self, attribute: Any) -> int:
        return int(check(self._driver.cuDeviceGetAttribute(attribute, self._dev), str(attribute)))

    @property
    def max_shared_bytes(self) -> int:
        return self._max_shared

    @property
    def arch(self) -> str:
        _, nvrtc = _bindings()
        supported = check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
        return pick_arch(*self.compute_capability, [int(a) for a in supported])

    @contextmanager
    def _current(self) -> Iterator[None]:
        """Make the primary context current (pushing it only when another one is)."""
        driver = self._driver
        current = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if current is not None and int(current) == int(self._context):
            yield
            return
        check(driver.cuCtxPushCurrent(self._context), "cuCtxPushCurrent")
        try:
            yield
        finally:
            check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def load(self, module: str) -> None:
        """Compile (or take from the cache) and load one module; later calls are free."""
        with self._lock:
            if module in self._modules:
                return
            compiled = compile_module(module, self.arch, cache_dir=self._cache_dir)
            with self._current():
                try:
                    handle = check(
                        self._driver.cuModuleLoadData(compiled.image), "cuModuleLoadData"
                    )
                except KernelError:
                    if not compiled.from_cache:
                        raise
                    # A stale or damaged cache entry: rebuild it once.
                    compiled = compile_module(
                        module, self.arch, cache_dir=Path(tempfile.mkdtemp(prefix="vdet-nvrtc-"))
                    )
                    handle = check(
                        self._driver.cuModuleLoadData(compiled.image), "cuModuleLoadData"
                    )
            self._modules[module] = handle
            self.compiled[module] = compiled

    def _function(self, kernel: str) -> Any:
        function = self._functions.get(kernel)
        if function is None:
            module = _kernel_module(kernel)
            self.load(module)
            with self._current():
                function = check(
                    self._driver.cuModuleGetFunction(self._modules[module], kernel.encode()),
                    f"cuModuleGetFunction({kernel})",
                )
            self._functions[kernel] = function
        return function

    def array(self, obj: object) -> DeviceArray:
        return device_array(obj)

    def launch(
        self,
        kernel: str,
        grid: Dim3,
        block: Dim3,
        shared_bytes: int,
        stream: int,
        args: Sequence[KernelArg],
    ) -> None:
        driver = self._driver
        function = self._function(kernel)
        params = pack_args(args)
        with self._current():
            if shared_bytes > 48 * 1024 and self._shared_opt_in.get(kernel, 0) < shared_bytes:
                attribute = (
                    driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                )
                check(
                    driver.cuFuncSetAttribute(function, attribute, shared_bytes),
                    f"cuFuncSetAttribute({kernel}, {shared_bytes} bytes of shared memory)",
                )
                self._shared_opt_in[kernel] = shared_bytes
            check(
                driver.cuLaunchKernel(
                    function,
                    *grid,
                    *block,
                    shared_bytes,
                    driver.CUstream(stream),
                    ctypes.addressof(params),
                    0,
                ),
                f"cuLaunchKernel({kernel})",
            )

    def memset_u32(self, ptr: int, value: int, count: int, stream: int) -> None:
        driver = self._driver
        with self._current():
            check(
                driver.cuMemsetD32Async(
                    driver.CUdeviceptr(ptr), value, count, driver.CUstream(stream)
                ),
                "cuMemsetD32Async",
            )

    def alloc(self, nbytes: int, stream: int) -> int:
        driver = self._driver
        with self._current():
            ptr = check(
                driver.cuMemAllocAsync(max(nbytes, 1), driver.CUstream(stream)), "cuMemAllocAsync"
            )
        return int(ptr)

    def free(self, ptr: int, stream: int) -> None:
        driver = self._driver
        with self._current():
            check(
                driver.cuMemFreeAsync(driver.CUdeviceptr(ptr), driver.CUstream(stream)),
                "cuMemFreeAsync",
            )

    def synchronize(self, stream: int = 0) -> None:
        with self._current():
            check(
                self._driver.cuStreamSynchronize(self._driver.CUstream(stream)),
                "cuStreamSynchronize",
            )
