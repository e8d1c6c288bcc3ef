"""`vdet bench serve`: check the arguments, run, write the result JSON, print a summary.

Argument errors exit with status 2 and one line, before any server starts.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys

from vdet.bench.serve.options import ServeBenchUsageError, options_from_args
from vdet.bench.serve.server import vdet_executable
from vdet.core.extras import needs_extra


def _clients_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("httpx", "websockets"))


def run_cli(args: argparse.Namespace) -> int:
    if not _clients_installed():
        print(
            f"vdet bench serve: {needs_extra('its WebSocket clients (websockets)', 'bench')}",
            file=sys.stderr,
        )
        return 2
    try:
        opts = options_from_args(args)
        vdet_executable()
    except (ServeBenchUsageError, FileNotFoundError) as exc:
        print(f"vdet bench serve: {exc}", file=sys.stderr)
        return 2
    from vdet.bench.serve.runner import run_serve_bench

    # One line per request would bury the progress lines: the figures are in the result.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    result = run_serve_bench(opts)
    text = result.model_dump_json(indent=1)
    if opts.output is not None:
        opts.output.parent.mkdir(parents=True, exist_ok=True)
        opts.output.write_text(text + "\n")
        print(f"vdet bench serve: wrote {opts.output}", file=sys.stderr)
    else:
        print(text)
    failed = [v.name for v in result.variants if v.error]
    return 1 if failed and len(failed) == len(result.variants) else 0
