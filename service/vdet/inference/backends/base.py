"""The contract every inference backend (ONNX Runtime, Torch, TensorRT) fulfils.

This module owns only the interface: a backend takes a letterboxed NCHW float32 batch and returns
the raw head [B, 4 + nc, N] as float32, whatever precision it runs in internally. Preprocess and
NMS are not a backend's business (see vdet.inference.preprocess / postprocess), so every backend
is tested against the same CPU reference.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any

import numpy as np

from vdet.core.model import ModelInfo
from vdet.core.types import FloatArray


class InferenceBackend(ABC):
    """One loaded model on one device.

    `infer` must be safe to call from several threads at once (each video source runs its own
    pipeline thread); a backend that cannot run concurrently serialises internally.
    """

    name: str
    info: ModelInfo
    # Why this backend serves: set by `create_backend` ("configured: ...", or what `auto` chose
    # and what it passed over); /readyz and the vdet_backend metric show it.
    selection: str = ""

    @property
    def gpu_data_path(self) -> bool:
        """Whether this backend feeds the GPU data path (NVDEC, our kernels, one CUDA graph per
        stream: vdet.gpu.devices); False: frames decode on the CPU and go through `infer`."""
        return False

    @property
    @abstractmethod
    def device(self) -> str:
        """Human-readable description of where inference runs, e.g. "cpu (onnxruntime 1.20)"."""

    @property
    @abstractmethod
    def max_batch(self) -> int | None:
        """The most images one `infer` call runs at once; None when the batch is unbounded.

        Larger batches are still accepted (split internally); batchers use this to size groups.
        """

    @abstractmethod
    def infer(self, batch: FloatArray) -> FloatArray:
        """Run the network on (n, 3, H, W) float32 in [0, 1]; return raw head (n, 4 + nc, N).

        n >= 1; H, W must equal `info.input_hw`, or, where `rect_inputs`, be multiples of the
        stride no larger than it.
        """

    @property
    def parallel_calls(self) -> int:
        """How many `infer` calls run at once to good effect: a caller that keeps this many
        frames in flight (a stream's pipeline) gets more frames per second than one at a time.
        1: concurrent calls gain nothing (they queue, or share the device anyway)."""
        return 1

    @property
    def rect_inputs(self) -> bool:
        """Whether `infer` takes inputs smaller than `info.input_hw` (rectangular letterboxes).
        Backends whose graphs or engines fix the shape say no."""
        return False

    # ---- the GPU data path ---------------------------------------------------------------
    # What a backend whose `gpu_data_path` is True declares; vdet.gpu.devices builds its
    # devices from these alone, knowing no backend type. The others raise.

    def network_for(self, batch: int, input_hw: tuple[int, int]) -> Any:
        """A network for vdet.gpu.graphs on this backend's GPU: a (batch, 3, H, W)
        torch tensor of `network_dtype` -> the raw head (batch, 4 + nc, N) as a torch tensor,
        capturable in a CUDA graph. (H, W) is `info.input_hw`, or a rectangular input where
        `rect_networks` (no smaller than `network_min_hw`). Each call may give a network of its
        own (an execution context); callers keep what they get."""
        raise NotImplementedError(f"{type(self).__name__} does not feed the GPU data path")

    @property
    def network_dtype(self) -> Any:
        """The torch dtype of the input `network_for`'s networks take."""
        raise NotImplementedError(f"{type(self).__name__} does not feed the GPU data path")

    @property
    def network_channels_last(self) -> bool:
        """Whether those networks want their input channels_last (NHWC in memory)."""
        return False

    @property
    def rect_networks(self) -> bool:
        """Whether `network_for` takes inputs smaller than `info.input_hw`."""
        return False

    @property
    def network_min_hw(self) -> tuple[int, int] | None:
        """The smallest (H, W) `network_for` takes where it is bounded (an engine's profile);
        None: any stride multiple up to `info.input_hw` (when `rect_networks`)."""
        return None

    def replica(self, gpu: int) -> InferenceBackend:
        """This backend on CUDA device `gpu`: itself where it runs there, else a copy of the
        same model loaded there (the GPU data path runs one device per GPU)."""
        raise NotImplementedError(f"{type(self).__name__} does not feed the GPU data path")

    @abstractmethod
    def close(self) -> None:
        """Release the model and its device memory; calling it twice is harmless."""

    def check_batch(self, batch: FloatArray) -> FloatArray:
        """Validate an `infer` argument against the model; shared so all backends agree."""
        H, W = self.info.input_hw
        if batch.ndim != 4 or batch.shape[1] != 3 or not self._takes_hw(batch.shape[2:]):
            rect = f" or smaller multiples of {self.info.stride}" if self.rect_inputs else ""
            raise ValueError(f"batch must have shape (n, 3, {H}, {W}){rect}, got {batch.shape}")
        if batch.shape[0] == 0:
            raise ValueError("batch is empty; infer needs at least one image")
        if batch.dtype != np.float32:
            raise ValueError(f"batch must be float32, got {batch.dtype}")
        return batch

    def _takes_hw(self, hw: tuple[int, ...]) -> bool:
        if hw == self.info.input_hw:
            return True
        stride = self.info.stride
        return self.rect_inputs and all(
            0 < side <= limit and side % stride == 0
            for side, limit in zip(hw, self.info.input_hw, strict=True)
        )

    def __enter__(self) -> InferenceBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.info.path)!r}, device={self.device!r})"
