"""ONNX Runtime on the CPU: the reference backend, and the fallback when no GPU is present.

This module owns the `onnxruntime.InferenceSession`s of one model: one, or a pool of several
(`sessions`) that concurrent callers run on side by side. Static-batch models are fed in chunks
of their batch size, the last chunk zero-padded, so callers may send any batch size.
It must not preprocess or postprocess: it maps an NCHW float32 batch to the raw head only.
"""

from __future__ import annotations

import os
import queue

import numpy as np
import onnxruntime as ort

from vdet.core.model import load_model_info
from vdet.core.types import FloatArray
from vdet.inference.backends import BackendSpec, register_backend
from vdet.inference.backends.base import InferenceBackend

# The metadata entry `vdet quantize` stamps on the models it writes (vdet.modelkit.quantize).
_QUANTIZATION_KEY = "vdet_quantization"


class OnnxRuntimeBackend(InferenceBackend):
    """CPU `InferenceSession`s with every graph optimisation enabled.

    `threads` sets each session's intra-op thread count (None: ONNX Runtime's default, one per
    core, with one session; the cores shared out between sessions with several). `sessions`
    loads that many copies of the model; each `infer` call takes a free one, so that many calls
    run at once. On a small CPU two frames on one thread each finish sooner than two frames one
    after the other on two threads (the demo YOLOv8n at 384x640 on 2 busy cores: nearly twice the
    frames per second), at the price of each frame's latency. `infer` is thread-safe; with every
    session busy a call waits for one.
    """

    name = "onnxruntime"

    def __init__(
        self, model_path: str | os.PathLike[str], threads: int | None = None, sessions: int = 1
    ) -> None:
        if threads is not None and (isinstance(threads, bool) or threads < 1):
            raise ValueError(f"threads must be a positive int or None, got {threads!r}")
        if isinstance(sessions, bool) or not isinstance(sessions, int) or not 1 <= sessions <= 64:
            raise ValueError(f"sessions must be an int in 1..64, got {sessions!r}")
        self.info = load_model_info(model_path)
        if threads is None and sessions > 1:
            threads = max(1, (os.cpu_count() or 1) // sessions)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads is not None:
            options.intra_op_num_threads = threads
        self._threads = threads
        self._sessions = sessions
        pool: queue.SimpleQueue[ort.InferenceSession] = queue.SimpleQueue()
        for _ in range(sessions):
            pool.put(
                ort.InferenceSession(
                    str(self.info.path), sess_options=options, providers=["CPUExecutionProvider"]
                )
            )
        self._pool: queue.SimpleQueue[ort.InferenceSession] | None = pool
        session = pool.get()
        pool.put(session)
        model_input = session.get_inputs()[0]
        self._input_name: str = model_input.name
        self._output_name: str = session.get_outputs()[0].name
        # Half-precision exports take float16; the contract with callers stays float32.
        self._input_dtype = np.float16 if model_input.type == "tensor(float16)" else np.float32
        quantized = _QUANTIZATION_KEY in session.get_modelmeta().custom_metadata_map
        self._precision = (
            "int8" if quantized else "fp16" if self._input_dtype == np.float16 else "fp32"
        )

    @property
    def device(self) -> str:
        threads = "default" if self._threads is None else str(self._threads)
        sessions = f"{self._sessions} sessions x " if self._sessions > 1 else ""
        return f"cpu (onnxruntime {ort.__version__}, {sessions}{threads} threads)"

    @property
    def precision(self) -> str:
        """int8 for a model `vdet quantize` wrote, fp16 for a half-precision export, else fp32."""
        return self._precision

    @property
    def parallel_calls(self) -> int:
        return self._sessions

    @property
    def max_batch(self) -> int | None:
        return self.info.batch

    @property
    def rect_inputs(self) -> bool:
        return self.info.dynamic_hw

    def infer(self, batch: FloatArray) -> FloatArray:
        batch = self.check_batch(batch)
        pool = self._pool  # one read, so a concurrent close() cannot swap it mid-call
        if pool is None:
            raise RuntimeError(f"{self!r} is closed")
        session = pool.get()
        try:
            return self._infer_on(session, batch)
        finally:
            pool.put(session)

    def _infer_on(self, session: ort.InferenceSession, batch: FloatArray) -> FloatArray:
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
        # Dropping the reference frees the sessions once in-flight `infer` calls return.
        self._pool = None


register_backend(
    BackendSpec(
        kind=OnnxRuntimeBackend.name,
        factory=OnnxRuntimeBackend,
        priority=100,
        is_available=lambda: True,  # importing this module proved onnxruntime is installed
        accepts=lambda path: path.suffix.lower() == ".onnx",
    )
)
