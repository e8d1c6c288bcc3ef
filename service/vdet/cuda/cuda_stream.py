"""`on_stream`: make a torch CUDA stream current for a block, or do nothing without one.

The decoder, the GPU ops and the graph runners all run on a stream of their own on the GPU
and on no stream at all on the CPU (tests and the CPU reference paths); this is the one place
that tells the two apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def on_stream(stream: torch.cuda.Stream | None) -> Iterator[None]:
    """`torch.cuda.stream(stream)` when a stream is given, else nothing (CPU, current stream)."""
    if stream is None:
        yield
        return
    with torch.cuda.stream(stream):
        yield


__all__ = ["on_stream"]
