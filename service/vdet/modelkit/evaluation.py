"""COCO-style accuracy of any model on any backend: mAP50-95, mAP50, per class and per size.

Scoring is delegated to faster-coco-eval (a maintained, bit-compatible reimplementation of
pycocotools); this module only runs the detector over a labelled image set and packs the
results. Evaluation thresholds follow common practice for mAP (a low score threshold so the
whole precision/recall curve is seen), not the serving defaults: vdet.core.contract's `EVAL_PARAMS`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from vdet.core.contract import EVAL_PARAMS, PostprocessParams
from vdet.inference.detector import Detector


@dataclass(frozen=True)
class EvalReport:
    model: str
    model_sha256: str
    backend: str
    device: str
    dataset: str
    images: int
    objects: int
    map50_95: float
    map50: float
    map75: float
    map_small: float
    map_medium: float
    map_large: float
    per_class_map50_95: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    params: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def evaluate(
    detector: Detector,
    coco_json: Path,
    image_root: Path | None = None,
    params: PostprocessParams = EVAL_PARAMS,
    batch_size: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Detect on every image of `coco_json` and score the detections against it.

    Image paths in the COCO file are relative to `image_root` (default: the JSON's folder).
    Category ids in the file must be the model's class ids.
    """
    from faster_coco_eval import COCO

    start = time.perf_counter()
    image_root = image_root or coco_json.parent
    gt = COCO(str(coco_json))
    names = detector.info.names
    for cat in gt.loadCats(gt.getCatIds()):
        if not 0 <= cat["id"] < len(names):
            raise ValueError(
                f"{coco_json}: category {cat['id']} ({cat['name']}) is not a class of the model "
                f"({len(names)} classes)"
            )
    image_ids = sorted(gt.getImgIds())
    results: list[dict[str, object]] = []
    for first in range(0, len(image_ids), batch_size):
        ids = image_ids[first : first + batch_size]
        images = [_read_image(image_root / gt.loadImgs(i)[0]["file_name"]) for i in ids]
        for image_id, (dets, _) in zip(ids, detector.detect(images, params), strict=True):
            for box, score, cls in zip(dets.xyxy, dets.scores, dets.class_ids, strict=True):
                x1, y1, x2, y2 = (float(v) for v in box)
                results.append(
                    {
                        "image_id": image_id,
                        "category_id": int(cls),
                        "score": float(score),
                        "bbox": [x1, y1, x2 - x1, y2 - y1],
                    }
                )
        if progress:
            progress(min(first + batch_size, len(image_ids)), len(image_ids))

    scores = score_detections(gt, results, names)
    return EvalReport(
        model=str(detector.info.path),
        model_sha256=detector.info.sha256,
        backend=detector.backend.name,
        device=detector.backend.device,
        dataset=str(coco_json),
        images=len(image_ids),
        objects=len(gt.getAnnIds()),
        **scores,
        seconds=round(time.perf_counter() - start, 2),
        params={
            k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in asdict(params).items()
        },
    )


def score_detections(
    gt: Any, results: list[dict[str, object]], names: Sequence[str]
) -> dict[str, Any]:
    """COCO bbox metrics of `results` (COCO result dicts) against the ground truth `gt`.

    Returns the EvalReport metric fields; all zero when there are no detections at all.
    """
    from faster_coco_eval import COCOeval_faster

    stats = np.zeros(12)
    per_class: dict[str, float] = {}
    if results:
        dt = gt.loadRes(results)
        ev = COCOeval_faster(gt, dt, "bbox", print_function=lambda *_: None)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
        stats = np.asarray(ev.stats)
        precision = ev.eval["precision"]  # [iou, recall, class, area, maxdet]
        for k, cat_id in enumerate(ev.params.catIds):
            p = precision[:, :, k, 0, -1]
            per_class[names[cat_id]] = round(float(p[p > -1].mean()) if (p > -1).any() else 0.0, 4)
    return {
        "map50_95": round(float(stats[0]), 4),
        "map50": round(float(stats[1]), 4),
        "map75": round(float(stats[2]), 4),
        "map_small": round(float(stats[3]), 4),
        "map_medium": round(float(stats[4]), 4),
        "map_large": round(float(stats[5]), 4),
        "per_class_map50_95": per_class,
    }


def _read_image(path: Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"cannot read image {path}")
    return image
