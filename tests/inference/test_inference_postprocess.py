"""decode_and_nms: hand-computed conventions, Ultralytics on random heads, and speed."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from vdet.inference.postprocess import (
    PostprocessParams,
    decode_and_nms,
    decode_and_nms_image,
    greedy_nms,
    postprocess,
    xywh_to_xyxy,
)
from vdet.inference.preprocess import compute_letterbox

MakeHead = Callable[[Any, Any], np.ndarray]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"conf_threshold": -0.1}, "conf_threshold"),
        ({"conf_threshold": 1.5}, "conf_threshold"),
        ({"conf_threshold": "0.5"}, "conf_threshold"),
        ({"iou_threshold": 1.01}, "iou_threshold"),
        ({"iou_threshold": True}, "iou_threshold"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"max_det": 0}, "max_det"),
        ({"classes": frozenset({-1})}, "classes"),
        ({"classes": frozenset({"person"})}, "classes"),
    ],
)
def test_params_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PostprocessParams(**kwargs)


def test_params_store_classes_as_frozenset() -> None:
    params = PostprocessParams(classes=[2, 0, 2])  # type: ignore[arg-type]
    assert params.classes == frozenset({0, 2})
    assert PostprocessParams(classes=frozenset()).classes == frozenset()


def boxes_of(make_head: MakeHead, cxcywh: Sequence[Sequence[float]], scores: Any) -> np.ndarray:
    return make_head(cxcywh, np.asarray(scores, np.float32))


# Box helpers in cx, cy, w, h: A and B overlap with IoU 0.6; C is far away.
A = (50.0, 50.0, 100.0, 100.0)  # xyxy 0,0,100,100
B = (50.0, 70.0, 100.0, 100.0)  # xyxy 0,20,100,120 -> IoU(A, B) = 80 / 120 = 0.667
C = (400.0, 400.0, 20.0, 20.0)
HALF = (50.0, 25.0, 100.0, 50.0)  # xyxy 0,0,100,50 -> IoU(A, HALF) = 0.5 exactly

HAND_CASES = [
    pytest.param([], np.zeros((0, 2)), {}, [], [], id="empty"),
    pytest.param([A], [[0.1, 0.2]], {}, [], [], id="nothing-passes"),
    pytest.param([A], [[0.25, 0.0]], {}, [], [], id="conf-is-strict"),
    pytest.param([A, C], [[0.5, 0.0], [0.0, 0.9]], {}, [1, 0], [1, 0], id="all-pass-sorted"),
    pytest.param([A, B], [[0.9, 0.0], [0.0, 0.8]], {}, [0, 1], [0, 1], id="class-aware-keeps"),
    pytest.param(
        [A, B],
        [[0.9, 0.0], [0.0, 0.8]],
        {"class_agnostic": True},
        [0],
        [0],
        id="agnostic-suppresses",
    ),
    pytest.param([A, B], [[0.8, 0.0], [0.9, 0.0]], {}, [1], [0], id="same-class-suppresses"),
    pytest.param(
        [A, HALF], [[0.9, 0.0], [0.8, 0.0]], {"iou_threshold": 0.5}, [0, 1], [0, 0], id="iou-strict"
    ),
    pytest.param(
        [A, HALF], [[0.9, 0.0], [0.8, 0.0]], {"iou_threshold": 0.49}, [0], [0], id="iou-above"
    ),
    pytest.param(
        [C, A, B],
        [[0.7, 0.0], [0.7, 0.0], [0.7, 0.0]],
        {},
        [0, 1],
        [0, 0],
        id="score-ties-by-anchor",
    ),
    pytest.param([A], [[0.6, 0.6]], {}, [0], [0], id="class-ties-lowest-id"),
    pytest.param(
        [A, C, HALF], [[0.9, 0], [0.8, 0], [0.7, 0]], {"max_det": 2}, [0, 1], [0, 0], id="max-det"
    ),
    pytest.param(
        [A, C], [[0.9, 0.0], [0.0, 0.8]], {"classes": frozenset({1})}, [1], [1], id="classes"
    ),
    pytest.param(
        [A], [[0.9, 0.8]], {"classes": frozenset({1})}, [], [], id="classes-never-relabel"
    ),
    pytest.param([A, C, HALF], [[0.9, 0], [0.8, 0], [0.7, 0]], {"top_k": 1}, [0], [0], id="top-k"),
    pytest.param(
        # A suppresses B; B would have suppressed D, but a suppressed box suppresses nothing.
        [A, B, (50.0, 90.0, 100.0, 100.0)],
        [[0.9, 0], [0.8, 0], [0.7, 0]],
        {},
        [0, 2],
        [0, 0],
        id="greedy-chain",
    ),
    pytest.param([A], [[np.nan, 0.9]], {}, [], [], id="nan-dropped"),
]


@pytest.mark.parametrize(("cxcywh", "scores", "kwargs", "anchors", "classes"), HAND_CASES)
def test_decode_and_nms_hand_cases(
    make_head: MakeHead,
    cxcywh: list[tuple[float, ...]],
    scores: Any,
    kwargs: dict[str, Any],
    anchors: list[int],
    classes: list[int],
) -> None:
    head = boxes_of(make_head, cxcywh, scores)
    dets, kept = decode_and_nms_image(head, PostprocessParams(**kwargs))
    assert kept.tolist() == anchors
    assert dets.class_ids.tolist() == classes
    assert dets.class_ids.dtype == np.int32
    assert dets.scores.dtype == np.float32
    assert dets.xyxy.dtype == np.float32
    expected_xyxy = xywh_to_xyxy(np.asarray(cxcywh, np.float32).reshape(-1, 4))[anchors]
    np.testing.assert_array_equal(dets.xyxy, expected_xyxy)
    np.testing.assert_array_equal(dets.scores, head[4:, anchors].max(axis=0))
    # The batched entry point gives the same answer.
    (batched,) = decode_and_nms(head[None], PostprocessParams(**kwargs))
    np.testing.assert_array_equal(batched.xyxy, dets.xyxy)


def test_xywh_to_xyxy() -> None:
    np.testing.assert_array_equal(
        xywh_to_xyxy(np.array([[10, 20, 4, 6]], np.float32)), [[8, 17, 12, 23]]
    )
    assert xywh_to_xyxy(np.zeros((0, 4), np.float32)).shape == (0, 4)


@pytest.mark.parametrize(
    ("xyxy", "class_ids", "agnostic", "max_keep", "expected"),
    [
        (np.zeros((0, 4)), np.zeros(0, np.int32), False, None, []),
        ([[0, 0, 10, 10], [0, 0, 10, 10]], [0, 0], False, None, [0]),
        ([[0, 0, 10, 10], [0, 0, 10, 10]], [0, 1], False, None, [0, 1]),
        ([[0, 0, 10, 10], [0, 0, 10, 10]], [0, 1], True, None, [0]),
        ([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]], [0, 0, 0], False, 2, [0, 1]),
        # zero-area boxes: union 0, IoU defined as 0, nothing suppressed
        ([[5, 5, 5, 5], [5, 5, 5, 5]], [0, 0], False, None, [0, 1]),
    ],
)
def test_greedy_nms(
    xyxy: Any, class_ids: Any, agnostic: bool, max_keep: int | None, expected: list[int]
) -> None:
    keep = greedy_nms(
        np.asarray(xyxy, np.float32),
        np.asarray(class_ids, np.int32),
        0.45,
        class_agnostic=agnostic,
        max_keep=max_keep,
    )
    assert keep.tolist() == expected


@pytest.mark.parametrize("shape", [(84, 10), (1, 4, 10), (2, 84), (1, 84, 10, 1)])
def test_decode_and_nms_rejects_bad_shapes(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="4 \\+ nc"):
        decode_and_nms(np.zeros(shape, np.float32), PostprocessParams())


@pytest.mark.parametrize("batch", [0, 1, 3])
def test_decode_and_nms_batch_sizes(batch: int) -> None:
    raw = np.zeros((batch, 6, 4), np.float32)
    result = decode_and_nms(raw, PostprocessParams())
    assert len(result) == batch
    assert all(len(d) == 0 for d in result)


def test_decode_and_nms_accepts_float16(make_head: MakeHead) -> None:
    head = make_head([A, C], np.array([[0.5, 0.0], [0.0, 0.875]]))
    (dets,) = decode_and_nms(head[None].astype(np.float16), PostprocessParams())
    assert dets.class_ids.tolist() == [1, 0]
    assert dets.scores.dtype == np.float32


def test_postprocess_maps_to_source(make_head: MakeHead) -> None:
    transforms = [
        compute_letterbox((1280, 720), (384, 640)),
        compute_letterbox((64, 64), (384, 640)),
    ]
    # box 100..200 x 60..160 in input pixels; first image: gain 0.5, pad_y 12
    head = make_head([(150.0, 110.0, 100.0, 100.0)], np.array([[0.9]]))
    raw = np.stack([head, head])
    first, second = postprocess(raw, transforms, PostprocessParams())
    np.testing.assert_allclose(first.xyxy, [[200, 96, 400, 296]])
    assert first.scores.tolist() == pytest.approx([0.9])
    # second image: gain 6, pad_x 128; the box's left edge falls in the padding and is clipped
    np.testing.assert_allclose(second.xyxy, [[0, 10, 12, 160 / 6]], rtol=1e-6)
    with pytest.raises(ValueError, match="transforms"):
        postprocess(raw, transforms[:1], PostprocessParams())
    assert postprocess(np.zeros((0, 6, 3), np.float32), [], PostprocessParams()) == []


def random_heads(seed: int, batch: int, nc: int, anchors: int, dense: bool = False) -> np.ndarray:
    """Random heads with clustered boxes (so NMS has work) and distinct scores (no ties)."""
    rng = np.random.default_rng(seed)
    raw = np.empty((batch, 4 + nc, anchors), np.float32)
    centres = rng.uniform(40, 600, (batch, 2, 12))
    pick = rng.integers(0, 12, (batch, anchors))
    raw[:, 0:2] = np.take_along_axis(centres, pick[:, None, :], axis=2) + rng.normal(
        0, 8, (batch, 2, anchors)
    )
    raw[:, 2:4] = rng.uniform(20, 120, (batch, 2, anchors))
    if dense:
        # Every anchor passes 0.25; distinct best scores, since tie order is undefined upstream.
        raw[:, 4:] = rng.uniform(0.26, 0.29, (batch, nc, anchors))
        best = np.linspace(0.3, 1.0, anchors, dtype=np.float32)
        for image in range(batch):
            classes = rng.integers(0, nc, anchors)
            raw[image, 4 + classes, np.arange(anchors)] = rng.permutation(best)
    else:
        raw[:, 4:] = rng.uniform(0.0, 1.0, (batch, nc, anchors)) ** 6
    return raw


ULTRALYTICS_CASES = [
    pytest.param({}, id="defaults"),
    pytest.param({"class_agnostic": True}, id="agnostic"),
    pytest.param({"conf_threshold": 0.1, "iou_threshold": 0.7}, id="loose"),
    pytest.param({"conf_threshold": 0.5, "iou_threshold": 0.3}, id="strict"),
    pytest.param({"max_det": 5}, id="max-det"),
    pytest.param({"classes": frozenset({0, 3})}, id="classes"),
    pytest.param({"conf_threshold": 0.9999}, id="empty"),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kwargs", ULTRALYTICS_CASES)
def test_matches_ultralytics_non_max_suppression(seed: int, kwargs: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    nms = pytest.importorskip("ultralytics.utils.nms")
    raw = random_heads(seed, batch=2, nc=5, anchors=2100)
    # Ultralytics keeps up to 30000 candidates; top_k above N makes the two comparable.
    params = PostprocessParams(top_k=30000, **kwargs)
    reference, reference_idx = nms.non_max_suppression(
        torch.from_numpy(raw),
        conf_thres=params.conf_threshold,
        iou_thres=params.iou_threshold,
        classes=None if params.classes is None else sorted(params.classes),
        agnostic=params.class_agnostic,
        max_det=params.max_det,
        return_idxs=True,
    )
    for image, (ref, ref_idx) in enumerate(zip(reference, reference_idx, strict=True)):
        dets, anchors = decode_and_nms_image(raw[image], params)
        ref = ref.numpy()
        assert anchors.tolist() == ref_idx.numpy().astype(int).tolist()
        np.testing.assert_allclose(dets.xyxy, ref[:, :4], atol=1e-4)
        np.testing.assert_array_equal(dets.scores, ref[:, 4])
        assert dets.class_ids.tolist() == ref[:, 5].astype(int).tolist()


def test_dense_head_matches_ultralytics() -> None:
    torch = pytest.importorskip("torch")
    nms = pytest.importorskip("ultralytics.utils.nms")
    raw = random_heads(7, batch=1, nc=80, anchors=8400, dense=True)
    params = PostprocessParams(top_k=30000)
    (ref,) = nms.non_max_suppression(torch.from_numpy(raw), 0.25, 0.45, max_det=300)
    (dets,) = decode_and_nms(raw, params)
    ref = ref.numpy()
    np.testing.assert_allclose(dets.xyxy, ref[:, :4], atol=1e-4)
    np.testing.assert_array_equal(dets.scores, ref[:, 4])
    assert dets.class_ids.tolist() == ref[:, 5].astype(int).tolist()


@pytest.mark.parametrize("class_agnostic", [False, True])
def test_dense_8400x80_is_fast(class_agnostic: bool) -> None:
    raw = random_heads(3, batch=1, nc=80, anchors=8400, dense=True)
    params = PostprocessParams(top_k=1000, class_agnostic=class_agnostic)
    best = float("inf")
    for _ in range(3):  # best of three: the budget is for the code, not a busy CI neighbour
        start = time.perf_counter()
        (dets,) = decode_and_nms(raw, params)
        best = min(best, time.perf_counter() - start)
    assert 0 < len(dets) <= params.max_det
    assert best < 0.1, f"decode_and_nms took {best * 1e3:.1f} ms on a dense 8400x80 head"
