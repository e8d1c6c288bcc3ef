"""Helpers for tests that run ingest workers."""

from __future__ import annotations

import random
import threading

from vdet.core.types import SourceState, VideoFrame
from vdet.ingest.mailbox import FrameMailbox
from vdet.ingest.source_thread import IngestOptions, SourceThread

Transition = tuple[str, SourceState, SourceState]


def start_worker(
    workers: list[SourceThread],
    url: str,
    options: IngestOptions,
    transitions: list[Transition] | None = None,
) -> SourceThread:
    """Start a worker for source "cam", recording its transitions; `workers` stops it later."""
    worker = SourceThread(
        "cam",
        url,
        FrameMailbox(),
        options,
        on_state_change=(lambda *t: transitions.append(t)) if transitions is not None else None,
        rng=random.Random(1),
    )
    workers.append(worker)
    worker.start()
    return worker


def drain(mailbox: FrameMailbox, timeout: float = 10.0) -> list[VideoFrame]:
    """Every frame taken until the mailbox is closed (or stays empty for `timeout`)."""
    frames = []
    while (frame := mailbox.get(timeout=timeout)) is not None:
        frames.append(frame)
    return frames


def take_in_background(mailbox: FrameMailbox) -> list[VideoFrame]:
    """Take every frame on a daemon thread, as a stream's pipeline does, into the list returned
    (a file that is not paced waits for its frames to be taken)."""
    frames: list[VideoFrame] = []
    threading.Thread(target=lambda: frames.extend(drain(mailbox)), daemon=True).start()
    return frames
