"""`vdet detect`: detections on an image, a video file or a stream, one JSON line per frame
(the REST result's schema: `frame_index`, `pts_s`, then POST /v1/detect's body), and
optionally the frames with their boxes drawn."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from vdet.cli.args import UsageError, add_detection_args
from vdet.core import contract
from vdet.core.assets import default_model_path

if TYPE_CHECKING:
    from vdet.core.types import Detections, ImageArray, StageTimings
    from vdet.inference.detector import Detector

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("detect", help="detect objects in an image or a video; JSON lines out")
    p.add_argument("source", help="image file, video file or stream URL")
    add_detection_args(p)
    p.add_argument("--max-frames", type=int, default=None, help="stop after N frames")
    p.add_argument("--output", type=Path, default=None, help="write an annotated image/video")
    p.add_argument(
        "--pass-damaged",
        action="store_true",
        help="detect on frames decoded from a damaged reference chain too (default: drop "
        "them until the next keyframe)",
    )
    p.set_defaults(func=run)


def _detector(args: argparse.Namespace) -> tuple[Detector, contract.PostprocessParams]:
    from vdet.core.model import ModelError
    from vdet.inference.detector import Detector
    from vdet.streams.params import resolve_classes

    model = args.model or default_model_path()
    try:
        detector = Detector.open(model, args.backend, input_shape=args.input_shape)
    except (FileNotFoundError, ModelError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    try:
        refs = [c.strip() for c in args.classes.split(",")] if args.classes else None
        classes = resolve_classes(refs, detector.info.names)
        params = contract.PostprocessParams(
            conf_threshold=args.conf, iou_threshold=args.iou, max_det=args.max_det, classes=classes
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return detector, params


def run(args: argparse.Namespace) -> int:
    import cv2

    from vdet.core.redact import redact
    from vdet.ingest.reader import DamagedFrame, DecodeError, SourceReader
    from vdet.ingest.urls import validate_source_url
    from vdet.modelkit.dataset.writers import ClipWriter
    from vdet.streams.pictures import draw_detections

    detector, params = _detector(args)
    names = detector.info.names
    source = args.source
    if Path(source).suffix.lower() in IMAGE_SUFFIXES:
        image = (
            cast("ImageArray | None", cv2.imread(source, cv2.IMREAD_COLOR))
            if Path(source).is_file()
            else None
        )
        if image is None:
            raise UsageError(f"cannot read image {source}")
        ((dets, timings),) = detector.detect([image], params)
        print(_frame_record(0, None, image.shape[:2], dets, names, timings))
        if args.output:
            cv2.imwrite(str(args.output), draw_detections(image, dets, names))
        return 0

    try:
        url = validate_source_url(source)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    writer = None
    frames = damaged = 0
    in_damaged_chain = False
    with SourceReader(url, source_id="detect", pass_damaged_frames=args.pass_damaged) as reader:
        try:
            info = reader.open()
        except Exception as exc:  # PyAV raises many types for an unopenable source
            raise UsageError(redact(f"cannot open {source}: {exc}")) from None
        for item in reader.frames():
            if isinstance(item, DamagedFrame):
                damaged += 1
                if not in_damaged_chain:
                    print(f"vdet detect: {item.message}", file=sys.stderr)
                in_damaged_chain = True
                continue
            if isinstance(item, DecodeError):
                print(
                    f"vdet detect: decode error after frame {frames}: {item.message}",
                    file=sys.stderr,
                )
                continue
            in_damaged_chain = False
            ((dets, timings),) = detector.detect([item.image_bgr], params)
            print(
                _frame_record(
                    item.index, item.pts_seconds, item.image_bgr.shape[:2], dets, names, timings
                )
            )
            if args.output:
                if writer is None:
                    writer = ClipWriter(args.output, fps=info.fps or 30.0, crf=20)
                writer.write(draw_detections(item.image_bgr, dets, names))
            frames += 1
            if args.max_frames is not None and frames >= args.max_frames:
                break
    if writer is not None:
        writer.close()
    if reader.decode_errors or damaged:
        action = "passed on" if args.pass_damaged else "dropped"
        print(
            f"vdet detect: {reader.decode_errors} packet(s) failed to decode; {damaged} "
            f"frame(s) of damaged reference chains {action}",
            file=sys.stderr,
        )
    return 0


def _frame_record(
    index: int,
    pts: float | None,
    image_hw: tuple[int, int],
    dets: Detections,
    names: Sequence[str],
    timings: StageTimings,
) -> str:
    """One frame as JSON in the REST result's schema: POST /v1/detect's body (`DetectOut`),
    with the stream result's `frame_index` and `pts_s` in front."""
    from vdet.api.schemas import DetectOut
    from vdet.results.wire import detections_out, timings_out

    body = DetectOut(
        image_width=image_hw[1],
        image_height=image_hw[0],
        detections=detections_out(dets, names),
        timings_ms=timings_out(timings),
    )
    return json.dumps({"frame_index": index, "pts_s": pts, **body.model_dump(mode="json")})
