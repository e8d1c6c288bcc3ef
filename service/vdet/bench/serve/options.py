"""What one `vdet bench serve` run is asked to do: the variants, the stream steps, the timings.

Variants are free-form on purpose: `--variant NAME:key=value ...` turns each dotted settings key
into the `VDET_*` environment variable `vdet serve` reads (`gpu.batch=8` -> `VDET_GPU__BATCH=8`),
and an all-upper-case key (`CUDA_MPS_PIPE_DIRECTORY=/x`) is passed as an environment variable
as it is. So settings that a future `vdet serve` adds can be compared without changing this
benchmark; a server that rejects one fails its variant, not the run. This module only parses
and checks; it starts nothing.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
SETTING_KEY = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")
ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")
DEFAULT_VARIANT = "one-process:"
MAX_STREAMS = 1024
MAX_CLIENTS = 64


class ServeBenchUsageError(ValueError):
    """An argument of `vdet bench serve` the user must fix; the message says which and why."""


@dataclass(frozen=True)
class Variant:
    """One server configuration to measure: `settings` become `VDET_*` variables, `env` is
    passed as it is."""

    name: str
    settings: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        """The variables this variant adds to the server's environment."""
        out = {
            "VDET_" + key.upper().replace(".", "__"): value for key, value in self.settings.items()
        }
        out.update(self.env)
        return out


@dataclass(frozen=True)
class ServeBenchOptions:
    """Everything a run needs, checked."""

    streams: tuple[int, ...]
    duration_s: float
    warmup_s: float
    clients: int
    variants: tuple[Variant, ...]
    clip: Path | None = None
    model: Path | None = None
    backend: str = "auto"
    output: Path | None = None
    pipeline_frames: int = 0
    unpaced: bool = False
    ultralytics: bool = False
    ultralytics_frames: int = 150
    control_interval_s: float = 0.25
    start_timeout_s: float = 180.0
    stop_timeout_s: float = 15.0
    kill_worker_after_s: float | None = None
    kill_worker_streams: tuple[int, ...] = ()  # the steps that kill one; all when asked
    # --find-ceiling: `streams` are steps of `ceiling_step` up to `ceiling_max`, and the run
    # stops at the first that is not real time, drops frames or has a p99 over `p99_limit_ms`.
    find_ceiling: bool = False
    ceiling_step: int = 16
    ceiling_max: int = MAX_STREAMS
    p99_limit_ms: float = 50.0
    decode_ceiling_s: float = 0.0  # the decode-only ceiling measured first, this long; 0: not
    memory_every_s: float = 0.0  # each process's memory sampled this often in a window; 0: not


def parse_variant(text: str) -> Variant:
    """`NAME:key=value key=value ...` (settings and env separated by spaces) -> Variant."""
    name, sep, rest = text.partition(":")
    if not sep:
        raise ServeBenchUsageError(
            f"--variant {text!r}: expected NAME:[key=value ...], e.g. 'one-process:' or "
            "'batch8:gpu.batch=8'"
        )
    if not VARIANT_NAME.match(name):
        raise ServeBenchUsageError(
            f"--variant {text!r}: the name must be 1-64 letters, digits, '_', '.', '+', '-'"
        )
    settings: dict[str, str] = {}
    env: dict[str, str] = {}
    for item in rest.split():
        key, eq, value = item.partition("=")
        if not eq:
            raise ServeBenchUsageError(f"--variant {name}: {item!r} is not key=value")
        if ENV_KEY.match(key):
            target = env
        elif SETTING_KEY.match(key):
            target = settings
        else:
            raise ServeBenchUsageError(
                f"--variant {name}: {key!r} is neither a settings key (lower case, dotted: "
                "gpu.batch) nor an environment variable (upper case: CUDA_VISIBLE_DEVICES)"
            )
        if key in target:
            raise ServeBenchUsageError(f"--variant {name}: {key!r} is given twice")
        target[key] = value
    return Variant(name, settings, env)


def parse_streams(text: str, name: str = "--streams") -> tuple[int, ...]:
    """`8,16,32` -> (8, 16, 32): distinct positive counts, run in the order given."""
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ServeBenchUsageError(
            f"{name} must be comma-separated integers, got {text!r}"
        ) from None
    if not counts:
        raise ServeBenchUsageError(f"{name} must name at least one stream count")
    if any(not 1 <= n <= MAX_STREAMS for n in counts):
        raise ServeBenchUsageError(f"{name}: each count must be 1..{MAX_STREAMS}, got {text!r}")
    if len(set(counts)) != len(counts):
        raise ServeBenchUsageError(f"{name}: a count is repeated in {text!r}")
    return counts


def _positive(name: str, value: float, *, zero_ok: bool = False) -> float:
    if value < 0 or (value == 0 and not zero_ok) or value != value:
        bound = ">= 0" if zero_ok else "> 0"
        raise ServeBenchUsageError(f"{name} must be {bound}, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `vdet bench serve`, as one group of the `vdet bench` parser.

    It shares `--model`, `--backend` and `--output` with the other scenarios.
    """
    group = parser.add_argument_group(
        "serve", "drive a real `vdet serve` over HTTP and WebSocket (vdet bench serve)"
    )
    group.add_argument(
        "--streams", default="1,2", help="serve: stream counts to step through, e.g. 8,16,32,64"
    )
    group.add_argument(
        "--duration", type=float, default=10.0, help="serve: measured seconds per step"
    )
    group.add_argument(
        "--warmup-seconds",
        type=float,
        default=3.0,
        help="serve: seconds after every stream has published, before measuring",
    )
    group.add_argument(
        "--clients", type=int, default=1, help="serve: WebSocket clients on /v1/events"
    )
    group.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="NAME:[key=value ...]",
        help="serve: a server configuration (repeatable); settings keys become VDET_* "
        "variables (gpu.batch=8 -> VDET_GPU__BATCH=8), UPPER_CASE keys are passed as they "
        f"are. Default: {DEFAULT_VARIANT!r} (today's serve)",
    )
    group.add_argument(
        "--clip", type=Path, default=None, help="serve: video file (default: the sample clip)"
    )
    group.add_argument(
        "--pipeline-frames",
        type=int,
        default=0,
        metavar="F",
        help="serve: also run `vdet bench pipeline` on the clip for F frames first (one "
        "stream, no service: the same-run ceiling on a shared machine); 0: not",
    )
    group.add_argument(
        "--unpaced",
        action="store_true",
        help="serve: add the streams with realtime false, so each analyses the clip frame by "
        "frame as fast as the server detects (none dropped): results/s is the throughput; the "
        "control calls are GETs only (no extra stream added and removed)",
    )
    group.add_argument(
        "--control-interval",
        type=float,
        default=0.25,
        help="serve: seconds between control calls (GET detections; every 4th a POST or "
        "DELETE) during each measured window",
    )
    group.add_argument(
        "--kill-worker-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="serve: this many seconds into a measured window, SIGKILL one worker process "
        "that runs streams (from GET /v1/workers) and measure the other streams' drops and "
        "the killed streams' return; variants without worker processes record why not",
    )
    group.add_argument(
        "--kill-worker-streams",
        default=None,
        metavar="N[,N...]",
        help="serve: the stream counts whose step kills a worker (default: every step)",
    )
    group.add_argument(
        "--find-ceiling",
        action="store_true",
        help="serve: size the node: steps of --step paced streams (16, 32, ...) up to "
        "--max-streams, stopping at the first that is not real time, drops a frame or has a "
        "p99 latency over --p99-ms; the result's `ceiling` names the largest that held, beside "
        "the decode-only ceiling measured first in the same call (--decode-seconds)",
    )
    group.add_argument("--step", type=int, default=16, help="serve: --find-ceiling's step")
    group.add_argument(
        "--min-streams",
        type=int,
        default=None,
        help="serve: --find-ceiling's first step (default: --step): a node known to hold N "
        "starts the search above it",
    )
    group.add_argument(
        "--max-streams",
        type=int,
        default=MAX_STREAMS,
        help="serve: --find-ceiling stops here at the latest",
    )
    group.add_argument(
        "--p99-ms",
        type=float,
        default=50.0,
        help="serve: --find-ceiling's latency bound (frame arrival -> client, p99, worst client)",
    )
    group.add_argument(
        "--decode-seconds",
        type=float,
        default=10.0,
        help="serve: --find-ceiling measures the decode-only ceiling this long first (0: not)",
    )
    group.add_argument(
        "--memory-every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="serve: sample each process's RSS and GPU memory this often in every window "
        "(server, each worker, each client, the benchmark) and report their slopes; for a "
        "soak, one long step (--duration 1800); 0: not",
    )
    group.add_argument(
        "--start-timeout", type=float, default=180.0, help="serve: seconds to wait for /readyz"
    )
    group.add_argument(
        "--stop-timeout",
        type=float,
        default=15.0,
        help="serve: seconds after SIGTERM before the server is killed",
    )


def options_from_args(args: argparse.Namespace) -> ServeBenchOptions:
    """Check the parsed arguments; ServeBenchUsageError names the first bad one."""
    variants = tuple(parse_variant(v) for v in (args.variant or [DEFAULT_VARIANT]))
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ServeBenchUsageError(f"--variant names must be distinct, got {names}")
    if not 1 <= args.clients <= MAX_CLIENTS:
        raise ServeBenchUsageError(f"--clients must be 1..{MAX_CLIENTS}, got {args.clients}")
    if args.clip is not None and not args.clip.is_file():
        raise ServeBenchUsageError(f"--clip: no such file {args.clip}")
    if args.model is not None and not args.model.is_file():
        raise ServeBenchUsageError(f"--model: no such file {args.model}")
    if not 0 <= args.pipeline_frames <= 100_000:
        raise ServeBenchUsageError(
            f"--pipeline-frames must be 0..100000, got {args.pipeline_frames}"
        )
    streams = parse_streams(args.streams)
    duration = _positive("--duration", args.duration)
    find_ceiling = bool(getattr(args, "find_ceiling", False))
    step, most = getattr(args, "step", 16), getattr(args, "max_streams", MAX_STREAMS)
    if find_ceiling:
        if args.unpaced:
            raise ServeBenchUsageError(
                "--find-ceiling steps paced streams (real time is its test); drop --unpaced"
            )
        first = getattr(args, "min_streams", None) or step
        if not 1 <= step <= MAX_STREAMS or not 1 <= first <= most <= MAX_STREAMS:
            raise ServeBenchUsageError(
                f"--step must be 1..{MAX_STREAMS} and --min-streams <= --max-streams <= "
                f"{MAX_STREAMS}, got {step}, {first} and {most}"
            )
        streams = tuple(range(first, most + 1, step))
    kill_after, kill_streams = _kill_options(args, streams, duration)
    return ServeBenchOptions(
        streams=streams,
        duration_s=duration,
        warmup_s=_positive("--warmup-seconds", args.warmup_seconds, zero_ok=True),
        clients=args.clients,
        variants=variants,
        clip=args.clip,
        model=args.model,
        backend=args.backend,
        output=args.output,
        pipeline_frames=args.pipeline_frames,
        unpaced=args.unpaced,
        ultralytics=getattr(args, "baseline", None) == "ultralytics",
        ultralytics_frames=getattr(args, "frames", 150),
        control_interval_s=_positive("--control-interval", args.control_interval),
        start_timeout_s=_positive("--start-timeout", args.start_timeout),
        stop_timeout_s=_positive("--stop-timeout", args.stop_timeout),
        kill_worker_after_s=kill_after,
        kill_worker_streams=kill_streams,
        find_ceiling=find_ceiling,
        ceiling_step=step,
        ceiling_max=most,
        p99_limit_ms=_positive("--p99-ms", getattr(args, "p99_ms", 50.0)),
        memory_every_s=_positive(
            "--memory-every", getattr(args, "memory_every", 0.0), zero_ok=True
        ),
        decode_ceiling_s=(
            _positive("--decode-seconds", getattr(args, "decode_seconds", 10.0), zero_ok=True)
            if find_ceiling
            else 0.0
        ),
    )


def _kill_options(
    args: argparse.Namespace, streams: tuple[int, ...], duration_s: float
) -> tuple[float | None, tuple[int, ...]]:
    """--kill-worker-after inside the window, --kill-worker-streams among --streams."""
    after: float | None = args.kill_worker_after
    if after is None:
        if args.kill_worker_streams is not None:
            raise ServeBenchUsageError("--kill-worker-streams needs --kill-worker-after")
        return None, ()
    if not 0 < after < duration_s:
        raise ServeBenchUsageError(
            f"--kill-worker-after must be inside the measured window (0 < s < --duration "
            f"{duration_s:g}), got {after:g}"
        )
    if args.kill_worker_streams is None:
        return after, streams
    chosen = parse_streams(args.kill_worker_streams, "--kill-worker-streams")
    unknown = [n for n in chosen if n not in streams]
    if unknown:
        raise ServeBenchUsageError(
            f"--kill-worker-streams: {unknown} not among --streams {list(streams)}"
        )
    return after, chosen
