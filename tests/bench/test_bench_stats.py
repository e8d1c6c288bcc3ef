"""The one percentile definition (vdet.bench.stats) and the figures built on it, which must keep
the meaning the committed result files give them."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from vdet.bench.serve.events_client import latency_summary_ms
from vdet.bench.stats import percentile_key, percentiles, summarize_ms


def _old_pipeline_nearest(values: list[float], q: float) -> float:
    """bench/gpu/pipeline.py's own percentile before vdet.bench.stats (its results' meaning)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 10, 99, 100, 101, 300, 1001])
def test_nearest_is_the_gpu_pipeline_results_definition(n: int) -> None:
    rng = np.random.default_rng(n)
    # Repeated values too: ranks, not values, decide.
    values = [float(v) for v in rng.integers(0, 50, n) / 7.0]
    found = percentiles(values, (50, 90, 99), "nearest")
    for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        assert found[key] == _old_pipeline_nearest(values, q)


@pytest.mark.parametrize("n", [1, 2, 5, 200, 201])
def test_linear_is_numpy_default_and_its_median_the_usual_one(n: int) -> None:
    values = list(np.random.default_rng(7).exponential(3.0, n))
    found = percentiles(values, (10, 50, 95, 99))
    assert found == {
        "p10": float(np.percentile(values, 10)),
        "p50": float(np.percentile(values, 50)),
        "p95": float(np.percentile(values, 95)),
        "p99": float(np.percentile(values, 99)),
    }
    assert found["p50"] == pytest.approx(statistics.median(values), rel=1e-12)


def test_linear_and_nearest_differ_between_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]  # rank 1.5 of 0..3: between 2 and 3
    assert percentiles(values, (50,)) == {"p50": 2.5}
    assert percentiles(values, (50,), "nearest") == {"p50": 3.0}  # a tie: the even rank, 2


def test_keys_name_the_point() -> None:
    assert [percentile_key(p) for p in (50, 99, 99.9, 0, 100)] == [
        "p50",
        "p99",
        "p99.9",
        "p0",
        "p100",
    ]
    assert list(percentiles([1.0, 2.0], (99.9, 0.5))) == ["p99.9", "p0.5"]


@pytest.mark.parametrize(
    ("samples", "points", "method", "message"),
    [
        ([], (50,), "linear", "non-empty"),
        ([[1.0, 2.0]], (50,), "linear", "flat"),
        ([1.0, float("nan")], (50,), "linear", "finite"),
        ([1.0, float("inf")], (50,), "linear", "finite"),
        ([1.0], (101,), "linear", "0..100"),
        ([1.0], (-1,), "linear", "0..100"),
        ([1.0], (50,), "lower", "method"),
    ],
)
def test_bad_input_is_refused(
    samples: list[float], points: tuple[float, ...], method: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        percentiles(samples, points, method)  # type: ignore[arg-type]


def test_summaries_keep_their_keys_and_rounding() -> None:
    seconds = [0.001 * i for i in range(1, 101)]
    assert summarize_ms(seconds) == {
        "p50": 50.5,
        "p95": 95.05,
        "p99": 99.01,
        "mean": 50.5,
        "n": 100,
    }
    assert summarize_ms([]) == {}
    assert latency_summary_ms(seconds) == {
        "p50": 50.5,
        "p90": 90.1,
        "p99": 99.01,
        "max": 100.0,
        "mean": 50.5,
        "n": 100,
    }
