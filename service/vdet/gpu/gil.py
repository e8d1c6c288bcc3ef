"""How a process that serves many streams tunes the Python interpreter it runs in.

Only process-wide interpreter settings live here (today the GIL switch interval); the callers
decide when they apply: the app when it starts GPU workers, and the streams benchmark.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)

# Python's default GIL switch interval (5 ms) lets one busy thread keep dozens of ingest and
# pipeline threads, each needing the GIL for microseconds per packet or frame, waiting.
_SWITCH_INTERVAL_S = 0.0005


def tune_interpreter_for_streams() -> None:
    """Shorten the GIL switch interval for a process serving many GPU streams (module-wide:
    called once by the app when it starts GPU workers, and by the streams benchmark)."""
    if sys.getswitchinterval() > _SWITCH_INTERVAL_S:
        log.info("GIL switch interval -> %.4f s (many streams)", _SWITCH_INTERVAL_S)
        sys.setswitchinterval(_SWITCH_INTERVAL_S)


__all__ = ["tune_interpreter_for_streams"]
