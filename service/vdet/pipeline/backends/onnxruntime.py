"""ONNX Runtime on the CPU: the reference backend, and the fallback when no GPU is present.

This module owns one `onnxruntime.InferenceSession` per model. Static-batch models are fed in
chunks of their batch size, the last chunk zero-padded, so callers may send any batch size.
It must not preprocess or postprocess: it maps an NCHW float32 batch to the raw head only.
"""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort

from ...types import FloatArray
from ..model import load_model_info
from . import BackendSpec, register_backend
from .base import InferenceBackend


class OnnxRuntimeBackend(InferenceBackend):
    """A CPU `InferenceSession` with every graph optimisation enabled.

    `threads` sets ONNX Runtime's intra-op thread count (None: its default, one per core).
    `infer` is thread-safe: `InferenceSession.run` may be called concurrently.
    """

    name = "onnxruntime"

    def __init__(self, model_path: str | os.PathLike[str], threads: int | None = None) -> None:
        if threads is not None and (isinstance(threads, bool) or threads < 1):
            raise ValueError(f"threads must be a positive int or None, got {threads!r}")
        self.info = load_model_info(model_path)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads is not None:
            options.intra_op_num_threads = threads
        self._threads = threads
        self._session: ort.InferenceSession | None = ort.InferenceSession(
            str(self.info.path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        model_input = self._session.get_inputs()[0]
        self._input_name: str = model_input.name
        self._output_name: str = self._session.get_outputs()[0].name
        # Half-precision exports take float16; the contract with callers stays float32.
        self._input_dtype = np.float16 if model_input.type == "tensor(float16)" else np.float32

    @property
    def device(self) -> str:
        threads = "default" if self._threads is None else str(self._threads)
        return f"cpu (onnxruntime {ort.__version__}, {threads} threads)"

    @property
    def max_batch(self) -> int | None:
        return self.info.batch

    @property
    def rect_inputs(self) -> bool:
        return self.info.dynamic_hw

    def infer(self, batch: FloatArray) -> FloatArray:
        batch = self.check_batch(batch)
        session = self._session  # one read, so a concurrent close() cannot swap it mid-call
        if session is None:
            raise RuntimeError(f"{self!r} is closed")
        fixed = self.info.batch
        if fixed is None or fixed == len(batch):
            return self._run(session, batch)
        outputs = []
        for start in range(0, len(batch), fixed):
            chunk = batch[start : start + fixed]
            n = len(chunk)
            if n < fixed:
                padded = np.zeros((fixed, *batch.shape[1:]), np.float32)
                padded[:n] = chunk
                chunk = padded
            outputs.append(self._run(session, chunk)[:n])
        return np.concatenate(outputs, axis=0)

    def _run(self, session: ort.InferenceSession, batch: FloatArray) -> FloatArray:
        feed = batch.astype(self._input_dtype, copy=False)
        (raw,) = session.run([self._output_name], {self._input_name: feed})
        raw = np.asarray(raw, dtype=np.float32)
        expected_rows = 4 + self.info.num_classes
        if raw.ndim != 3 or raw.shape[:2] != (len(batch), expected_rows):
            raise RuntimeError(
                f"{self.info.path}: output shape {raw.shape} is not "
                f"({len(batch)}, {expected_rows}, N)"
            )
        return raw

    def close(self) -> None:
        # Dropping the reference frees the session once in-flight `infer` calls return.
        self._session = None


register_backend(
    BackendSpec(
        kind=OnnxRuntimeBackend.name,
        factory=OnnxRuntimeBackend,
        priority=100,
        is_available=lambda: True,  # importing this module proved onnxruntime is installed
        accepts=lambda path: path.suffix.lower() == ".onnx",
    )
)
