"""Cross-stream batching on one GPU: frames of several streams run as one batched graph.

A `Batcher` owns one `BatchedGraphRunner` (one input shape, a graph per batch-size bucket) and
a thread that seals and launches batches; each stream's own thread stages its frame into the
open batch and reads its own rows back. The GPU device (vdet.gpu.devices) makes one per input
shape and decides nothing else here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from vdet.gpu.frame_ops import Nv12Geometry
from vdet.gpu.graphs import BatchedGraphRunner, BatchOutput, LaunchedBatch, RunResult
from vdet.inference.postprocess import PostprocessParams
from vdet.ingest.nvdec import GpuVideoFrame

# A batched request not answered within this long means the batcher is wedged.
_BATCH_REPLY_TIMEOUT_S = 30.0


@dataclass
class Request:
    """One frame's place in a batch, and where that batch's output goes."""

    index: int
    done: threading.Event = field(default_factory=threading.Event)
    output: BatchOutput | None = None
    error: BaseException | None = None


class Batcher:
    """Gathers up to `runner.batch` frames with the same params (waiting at most `wait_s` after
    the first) and runs them as one batch; callers block in `submit` until theirs is done.

    Per-frame host work stays in each frame's own thread, which `submit` runs in: it takes the
    next index of the open batch, stages (preprocesses) its frame there and, once the batch is
    done, reads its own detections. The batcher thread only seals the batch, launches its
    graph and waits for it, and the next batch stages meanwhile (the stream runs it after
    this one). One thread doing every frame's launches and row reading in series left the GPU
    mostly idle at batch 8, slower than batch 1.
    """

    def __init__(self, runner: BatchedGraphRunner, wait_s: float, name: str) -> None:
        self.runner = runner
        self.wait_s = wait_s
        self.batches = 0
        self.frames = 0
        self._cond = threading.Condition()
        self._open: list[Request] = []  # the batch being gathered, in index order
        self._params: PostprocessParams | None = None
        self._opened_at = 0.0
        self._staged = 0  # of the open batch's frames, how many are staged (or failed to be)
        self._sealed = False  # the open batch takes no more frames: it is being launched
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, frame: GpuVideoFrame, params: PostprocessParams) -> RunResult:
        started = time.perf_counter()
        geometry = Nv12Geometry.of(
            frame.size_wh, self.runner.input_hw, frame.matrix, frame.colour_range, frame.bits
        )
        with self._cond:
            while not self._closed and (
                self._sealed
                or len(self._open) >= self.runner.batch
                or (self._open and self._params != params)
            ):
                self._cond.wait()
            if self._closed:
                raise RuntimeError("the GPU device is closed")
            request = Request(len(self._open))
            if not self._open:
                self._params, self._opened_at = params, time.monotonic()
            self._open.append(request)
            self._cond.notify_all()
        try:
            self.runner.stage(request.index, frame.nv12, geometry, frame.ready)
        except Exception as exc:  # this frame fails; the batch runs without its pixels
            request.error = exc
        finally:
            with self._cond:
                self._staged += 1
                self._cond.notify_all()
        if not request.done.wait(_BATCH_REPLY_TIMEOUT_S):
            raise TimeoutError(f"no batched result within {_BATCH_REPLY_TIMEOUT_S:g} s")
        if request.error is not None:
            raise request.error
        output = request.output
        assert output is not None
        detections = output.detections(request.index, geometry)
        return RunResult(
            detections, time.perf_counter() - started, output.replayed, output.launch_seconds
        )

    def close(self) -> None:
        """Run what is already gathered, refuse new frames, stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(5.0)
        with self._cond:  # a wedged batcher: whoever still waits gets an answer
            stranded, self._open = self._open, []
        for request in stranded:
            request.error = RuntimeError("the GPU device is closed")
            request.done.set()

    def _next_batch(self) -> tuple[list[Request], PostprocessParams] | None:
        """Wait for a batch to fill or time out, seal it, and take it once all of it is staged;
        None once closed with nothing gathered."""
        with self._cond:
            while not self._open and not self._closed:
                self._cond.wait()
            if not self._open:
                return None
            deadline = self._opened_at + self.wait_s
            while len(self._open) < self.runner.batch and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._sealed = True
            while self._staged < len(self._open):
                self._cond.wait()
            requests, params = self._open, self._params
            self._open, self._params, self._staged = [], None, 0
        assert params is not None
        return requests, params

    def _launch(self, requests: list[Request], params: PostprocessParams) -> LaunchedBatch:
        """Launch a sealed batch, then let the next one stage (the stream orders it after this
        one's graph), whether or not the launch worked."""
        try:
            return self.runner.launch(len(requests), params)
        finally:
            with self._cond:
                self._sealed = False
                self._cond.notify_all()

    def _run(self) -> None:
        while (taken := self._next_batch()) is not None:
            requests, params = taken
            output: BatchOutput | None = None
            error: Exception | None = None
            try:
                output = self.runner.finish(self._launch(requests, params))
            except Exception as exc:  # every frame of the batch gets the error; we go on
                error = exc
            if error is None:
                self.batches += 1
                self.frames += len(requests)
            for request in requests:
                if request.error is None:
                    request.output, request.error = output, error
                request.done.set()


__all__ = ["Batcher", "Request"]
