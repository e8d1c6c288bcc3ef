"""`vdet serve`: the HTTP/WebSocket service, on the embedded default (the demo model, the sample
clip looped as a live source named `demo`) unless the settings name sources."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from vdet.cli.args import UsageError
from vdet.core.assets import sample_clip

DEMO_SOURCE_ID = "demo"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the HTTP/WebSocket service",
        description="Run the HTTP/WebSocket service: the settings file (--config or "
        "VDET_CONFIG), VDET_* variables over it, these flags over both.",
        epilog="Every setting (key, type, default, bounds, environment variable): "
        "docs/configuration.md or `vdet config reference`. Before starting: `vdet config check "
        "FILE` validates a file and its sources; `vdet config show --config FILE` prints the "
        "effective settings and where each came from.",
    )
    p.add_argument("--config", type=Path, default=None, help="YAML settings file")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument(
        "--no-demo",
        action="store_true",
        help="don't add the looping demo source when no sources are configured",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vdet.api.app import create_app
    from vdet.api.server import GracefulServer, server_config
    from vdet.config.base import ConfigError
    from vdet.config.settings import CONFIG_ENV_VAR, load_settings
    from vdet.config.streams import StreamSpec
    from vdet.ingest.urls import SourcePolicy
    from vdet.streams.startup import StartupError, check_startup

    if args.config is not None:
        # Parts that read the settings themselves (the tensorrt backend's engine settings)
        # must see the same file.
        os.environ[CONFIG_ENV_VAR] = str(args.config)
    overrides: dict[str, object] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port:
        overrides["port"] = args.port
    try:
        settings = load_settings(args.config, **overrides)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if not settings.sources and not args.no_demo:
        demo = StreamSpec(id=DEMO_SOURCE_ID, url=str(sample_clip()), loop=True, realtime=True)
        settings = settings.model_copy(update={"sources": [demo]})
    if not settings.model_path.is_file():
        raise UsageError(f"model not found: {settings.model_path}")
    try:
        check_startup(
            settings.sources, settings.streams_file, SourcePolicy.of(settings.ingest.source_policy)
        )
    except StartupError as exc:
        raise UsageError(str(exc)) from None
    app = create_app(settings, freeze_startup_objects=True)
    config = server_config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        limits=settings.limits,
    )
    GracefulServer(config, app).run()  # WebSocket goodbyes, then exit 0 on SIGTERM
    return 0
