"""The one definition of a percentile behind every benchmark figure.

Every benchmark (`vdet bench ...`, the WebSocket clients of `vdet bench serve`, the scripts of
bench/ and bench/gpu/) takes its percentiles here, so that a "p99" means the same thing in every
result file. This module owns only that arithmetic: it imports nothing but NumPy (the event
clients of `vdet bench serve` run it in processes of their own), and it must not name output
keys beyond `p<point>` (and `summarize_ms`'s), or measure anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

# NumPy's names for the two methods in use (`numpy.percentile(method=...)`):
# - "linear": interpolates between the two samples nearest rank q * (n - 1) (Hyndman & Fan
#   type 7, NumPy's and most tools' default); what every benchmark uses unless it says so.
# - "nearest": the sample at rank round(q * (n - 1)), ties to the even rank; always a value that
#   was measured. bench/gpu/pipeline.py has always reported its latencies this way, and keeps
#   doing so (its result files say `"percentile_method": "nearest"`).
PercentileMethod = Literal["linear", "nearest"]
PERCENTILE_METHODS: tuple[PercentileMethod, ...] = get_args(PercentileMethod)


def percentile_key(point: float) -> str:
    """The key a percentile goes by: 50 -> "p50", 99.9 -> "p99.9"."""
    return f"p{point:g}"


def percentiles(
    samples: npt.ArrayLike | Sequence[float],
    points: Sequence[float],
    method: PercentileMethod = "linear",
) -> dict[str, float]:
    """The `points` percentiles (0 to 100) of `samples`, keyed "p50", "p99", ...

    In the samples' own unit. Raises ValueError for no samples, a point outside 0..100, a
    sample that is not finite (a NaN would sort anywhere), or an unknown method.
    """
    if method not in PERCENTILE_METHODS:
        raise ValueError(f"method must be one of {PERCENTILE_METHODS}, got {method!r}")
    values = np.asarray(samples, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"percentiles need a flat, non-empty list of samples, got {values.shape}")
    if not np.isfinite(values).all():
        raise ValueError("percentiles of samples that are not all finite")
    wanted = [float(p) for p in points]
    if not all(0.0 <= p <= 100.0 for p in wanted):
        raise ValueError(f"percentile points must lie in 0..100, got {wanted}")
    found = np.percentile(values, wanted, method=method)
    return {percentile_key(p): float(v) for p, v in zip(wanted, found, strict=True)}


def summarize_ms(seconds: list[float]) -> dict[str, float]:
    """p50/p95/p99/mean in milliseconds of a list of durations in seconds, and the count."""
    if not seconds:
        return {}
    a = np.asarray(seconds) * 1e3
    found = percentiles(a, (50, 95, 99))
    return {
        **{key: round(value, 3) for key, value in found.items()},
        "mean": round(float(a.mean()), 3),
        "n": len(seconds),
    }
