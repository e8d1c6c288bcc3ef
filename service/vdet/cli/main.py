"""`vdet`: the parser of every command, and the one place a command's outcome becomes an exit
status. Errors a user can fix exit with status 2 and one clear line (`UsageError`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from vdet.cli import bench, config, detect, models, serve
from vdet.cli.args import UsageError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vdet", description="Real-time video object detection.")
    parser.add_argument("--log-level", default="info")
    sub = parser.add_subparsers(dest="command", required=True)
    serve.add_parser(sub)
    config.add_parser(sub)
    detect.add_parser(sub)
    models.add_parsers(sub)
    bench.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # httpx logs every request at INFO: one line per webhook delivery. vdet logs the
        # deliveries that fail itself; the rest only with --log-level debug.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UsageError as exc:
        print(f"vdet {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `vdet config show | head`: the reader has gone, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
