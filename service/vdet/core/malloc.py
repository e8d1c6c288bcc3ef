"""Giving freed memory back to the operating system (glibc), after a burst of large buffers.

glibc's malloc keeps memory freed from its heaps (one per thread that allocates) for reuse:
after a few large images were decoded in worker threads, the process keeps their size
resident for good. `trim()` asks it to return what is free (malloc_trim: the top of each heap
and every free page inside). A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    trim: Callable[[int], int] = function
    return trim


def trim() -> bool:
    """Return free heap memory to the operating system; whether any was (False: none, or not
    glibc). Takes a few milliseconds with large heaps: not on an event loop."""
    function = _malloc_trim()
    return bool(function(0)) if function is not None else False
