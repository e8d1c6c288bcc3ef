"""A stream as the API shows it (`StreamOut`), from the stream service's `StreamView`: on one
node, and in a fleet for a stream no node answers for yet."""

from __future__ import annotations

from vdet.api.schemas import EffectiveParams, StreamOut, StreamStatusOut
from vdet.core.redact import redact
from vdet.streams.service import StreamView


def stream_out(view: StreamView, names: tuple[str, ...], node: str | None = None) -> StreamOut:
    p, s = view.params, view.status
    return StreamOut(
        id=view.spec.id,
        node=node,
        worker=view.worker,
        spec=view.spec.model_copy(update={"url": redact(view.spec.url)}),
        effective=EffectiveParams(
            conf_threshold=p.conf_threshold,
            iou_threshold=p.iou_threshold,
            max_det=p.max_det,
            top_k=p.top_k,
            classes=None if p.classes is None else [names[i] for i in sorted(p.classes)],
            class_thresholds=class_thresholds_out(view.spec.class_thresholds, names),
        ),
        status=StreamStatusOut(
            state=s.state,
            attempts=s.attempts,
            reconnects=s.reconnects,
            # Redacted here too, whichever process produced them (vdet.ingest.urls.redact).
            last_error=_redacted(s.last_error),
            last_error_time=s.last_error_time,
            recent_errors=[redact(error) for error in s.recent_errors],
            pipeline_error=_redacted(view.pipeline_error),
            last_frame_age_s=view.last_frame_age_s,
            fps=s.fps,
            fps_nominal=s.fps_nominal,
            fps_processed=view.fps_processed,
            width=s.width,
            height=s.height,
            frames_decoded=s.frames_decoded,
            frames_processed=view.frames_processed,
            frames_dropped=s.frames_dropped,
            decode_errors=s.decode_errors,
            frames_damaged=s.frames_damaged,
            decode_path="nvdec" if s.decode_path == "nvdec" else "cpu" if s.decode_path else None,
            decode_reason=_redacted(s.decode_reason),
            frames_skipped=s.frames_skipped,
        ),
    )


def class_thresholds_out(
    thresholds: dict[str, float] | None, names: tuple[str, ...]
) -> dict[str, float] | None:
    """The spec's per-class thresholds keyed by class name (an id given as "2" shows as its
    name)."""
    if not thresholds:
        return None

    def name(ref: str) -> str:
        if ref in names or not ref.isdigit() or int(ref) >= len(names):
            return ref
        return names[int(ref)]

    return {name(ref): threshold for ref, threshold in thresholds.items()}


def _redacted(text: str | None) -> str | None:
    return None if text is None else redact(text)
