"""The GIL switch interval of a process that serves many GPU streams.

Process-wide, so the callers decide when it applies: the composition root when it opens GPU
devices, and the lab's streams benchmark.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)

# Python's default GIL switch interval (5 ms) lets one busy thread keep dozens of ingest and
# pipeline threads, each needing the GIL for microseconds per packet or frame, waiting.
_SWITCH_INTERVAL_S = 0.0005


def shorten_gil_switch_interval() -> None:
    """Shorten the GIL switch interval for a process serving many GPU streams (module-wide:
    called once by the app when it starts GPU devices, and by the streams benchmark)."""
    if sys.getswitchinterval() > _SWITCH_INTERVAL_S:
        log.info("GIL switch interval -> %.4f s (many streams)", _SWITCH_INTERVAL_S)
        sys.setswitchinterval(_SWITCH_INTERVAL_S)


__all__ = ["shorten_gil_switch_interval"]
