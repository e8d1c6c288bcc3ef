"""Detections cross a worker's pipe pickled: the round trip keeps every array exactly."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from vdet.core.types import Detections


def _detections(n: int, tracked: bool, class_dtype: type[np.integer]) -> Detections:
    rng = np.random.default_rng(n)
    return Detections(
        rng.uniform(0, 1000, (n, 4)).astype(np.float32),
        rng.uniform(0, 1, n).astype(np.float32),
        rng.integers(0, 80, n).astype(class_dtype),
        rng.integers(-1, 50, n).astype(np.int64) if tracked else None,
    )


@pytest.mark.parametrize("n", [0, 1, 10, 300])
@pytest.mark.parametrize("tracked", [False, True])
@pytest.mark.parametrize("class_dtype", [np.int32, np.int64])
def test_detections_survive_pickling_with_shapes_dtypes_and_values(
    n: int, tracked: bool, class_dtype: type[np.integer]
) -> None:
    sent = _detections(n, tracked, class_dtype)
    got = pickle.loads(pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL))
    for name in ("xyxy", "scores", "class_ids", "tracker_id"):
        a, b = getattr(sent, name), getattr(got, name)
        if a is None:
            assert b is None
            continue
        assert b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(b, a)
        assert b.flags.writeable  # like any unpickled array: the receiver may edit it
    assert got.xyxy.shape == (n, 4)
