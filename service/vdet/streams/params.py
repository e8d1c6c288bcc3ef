"""A stream's detection parameters: its own settings over the server's defaults.

Class names or ids become the model's ids here, and an unknown one is a ValueError naming it,
so the API answers 422 before a stream starts (or a change applies). Pure functions; the
stream manager, the worker pool (which checks a stream before it reaches a worker) and the
single-image routes share them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from vdet.config.streams import DetectionDefaults, StreamSpec
from vdet.core.contract import PostprocessParams
from vdet.inference.class_thresholds import ClassThresholds, thresholds_by_class


def resolve_classes(
    classes: Sequence[str | int] | None, names: Sequence[str]
) -> frozenset[int] | None:
    """Class names or ids -> ids of the model; ValueError naming the unknown ones."""
    if classes is None:
        return None
    by_name = {name: i for i, name in enumerate(names)}
    ids: set[int] = set()
    unknown: list[str] = []
    for ref in classes:
        if isinstance(ref, int) and not isinstance(ref, bool):
            if 0 <= ref < len(names):
                ids.add(ref)
            else:
                unknown.append(str(ref))
        elif isinstance(ref, str) and ref in by_name:
            ids.add(by_name[ref])
        elif isinstance(ref, str) and ref.isdigit() and int(ref) < len(names):
            ids.add(int(ref))
        else:
            unknown.append(repr(ref))
    if unknown:
        raise ValueError(
            f"unknown class(es) {', '.join(unknown)}; the model has ids 0..{len(names) - 1}: "
            f"{', '.join(names)}"
        )
    return frozenset(ids)


def resolve_params(
    defaults: DetectionDefaults,
    names: Sequence[str],
    *,
    conf_threshold: float | None = None,
    iou_threshold: float | None = None,
    max_det: int | None = None,
    classes: Sequence[str | int] | None = None,
) -> PostprocessParams:
    """Postprocess parameters from per-request/per-stream overrides over server defaults."""
    return PostprocessParams(
        conf_threshold=defaults.conf_threshold if conf_threshold is None else conf_threshold,
        iou_threshold=defaults.iou_threshold if iou_threshold is None else iou_threshold,
        top_k=defaults.top_k,
        max_det=defaults.max_det if max_det is None else max_det,
        classes=resolve_classes(classes, names),
    )


def stream_params(
    spec: StreamSpec, defaults: DetectionDefaults, names: Sequence[str]
) -> PostprocessParams:
    """A stream's postprocess parameters; ValueError naming unknown classes."""
    return resolve_params(
        defaults,
        names,
        conf_threshold=spec.conf_threshold,
        iou_threshold=spec.iou_threshold,
        max_det=spec.max_det,
        classes=spec.classes,
    )


def stream_class_thresholds(
    spec: StreamSpec, params: PostprocessParams, names: Sequence[str]
) -> ClassThresholds | None:
    """A stream's minimum score per class over its `conf_threshold`, or None when it has none;
    ValueError naming unknown classes."""
    by_class = thresholds_by_class(spec.class_thresholds, lambda refs: resolve_classes(refs, names))
    return ClassThresholds.of(params.conf_threshold, by_class)


def detect_params(
    params: PostprocessParams, thresholds: ClassThresholds | None
) -> PostprocessParams:
    """What decode + NMS runs with: the stream's params, at the lowest per-class threshold."""
    if thresholds is None or thresholds.floor == params.conf_threshold:
        return params
    return dataclasses.replace(params, conf_threshold=thresholds.floor)
