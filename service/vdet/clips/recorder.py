"""Clips of a stream's own video around its zone and line events, remuxed without re-encoding.

Each stream has a `ClipRecorder`: its source thread hands it every compressed video packet
(`on_packet`, a copy of the bytes into the pre-roll ring) and the publisher thread hands it
each result's events (`on_events`). The first event opens a clip from the ring's keyframe at
or before `pre_roll_s` earlier; events within the clip extend its end to `post_roll_s` after
the last one (overlapping events make one clip), up to `max_clip_s`. Packets past the end
close it; the finished clip goes to the one `ClipWriter` thread, which remuxes it into an
MP4 (Matroska for codecs MP4 does not carry) with the packets' own timestamps, writes it
into the `ClipStore` and applies the folder's limits. Writing never blocks a stream: a clip
finished while `queue` others wait is dropped and counted, and every failure (a full disk,
permissions) is counted by reason and logged, while detection goes on.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av

from vdet.clips.ring import PacketRing, RingPacket
from vdet.clips.store import SUFFIX, ClipEvent, ClipInfo, ClipStore
from vdet.config.clips import ClipSettings
from vdet.core.types import ZoneEvent

log = logging.getLogger(__name__)

# Codecs an MP4 carries as browsers play them; others go into Matroska.
MP4_CODECS = frozenset({"h264", "hevc", "av1", "mpeg4", "vp9"})

# (source id, outcome, bytes): "written", or a failure's reason: disk_full, permission,
# busy (the writer's queue was full), error.
ClipOutcome = Callable[[str, str, int], None]


class _Template:
    """What a clip's output stream copies: the codec parameters of one connection's video
    stream, held in a small never-written output container (the input's own stream dies with
    its container, and PyAV cannot copy from a closed one)."""

    def __init__(self, stream: Any) -> None:
        self._holder = av.open(io.BytesIO(), "w", format="matroska")
        self.stream = self._holder.add_stream_from_template(stream)
        self.time_base: Fraction = stream.time_base
        self.codec: str = stream.codec_context.name
        self.source = stream  # identity of the connection's stream, to notice a new one


@dataclass
class _OpenClip:
    template: _Template
    packets: list[RingPacket]
    end: float  # arrival time after which packets no longer belong
    started: float
    events: list[ClipEvent] = field(default_factory=list)


@dataclass(frozen=True)
class FinishedClip:
    source_id: str
    template: _Template
    packets: list[RingPacket]
    events: list[ClipEvent]


class ClipWriter:
    """The thread that writes finished clips of every stream of this process."""

    def __init__(self, settings: ClipSettings, store: ClipStore, outcome: ClipOutcome) -> None:
        self.settings = settings
        self.store = store
        self._outcome = outcome
        self._queue: queue.Queue[FinishedClip | None] = queue.Queue(maxsize=settings.queue)
        self._thread = threading.Thread(target=self._run, name="clip-writer", daemon=True)
        self._thread.start()

    def submit(self, clip: FinishedClip) -> None:
        try:
            self._queue.put_nowait(clip)
        except queue.Full:
            log.warning("clips of %s: the writer is behind; a clip is dropped", clip.source_id)
            self._outcome(clip.source_id, "busy", 0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what waits (up to `timeout_s`), then stop."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (clip := self._queue.get()) is not None:
            try:
                info = write_clip(self.store, clip)
                self._outcome(clip.source_id, "written", info.bytes)
            except OSError as exc:
                reason = {
                    errno.ENOSPC: "disk_full",
                    errno.EDQUOT: "disk_full",
                    errno.EACCES: "permission",
                    errno.EPERM: "permission",
                    errno.EROFS: "permission",
                }.get(exc.errno or 0, "error")
                log.error("clips of %s: cannot write a clip (%s): %s", clip.source_id, reason, exc)
                self._outcome(clip.source_id, reason, 0)
            except Exception:
                log.exception("clips of %s: cannot write a clip", clip.source_id)
                self._outcome(clip.source_id, "error", 0)
            try:
                self.store.enforce()
            except OSError as exc:
                log.error("clips: cannot apply the folder's limits: %s", exc)


def write_clip(store: ClipStore, clip: FinishedClip) -> ClipInfo:
    """Remux `clip` into the store; raises OSError (disk full, permissions) or av.FFmpegError."""
    template = clip.template
    container = "mp4" if template.codec in MP4_CODECS else "matroska"
    first, last = clip.packets[0], clip.packets[-1]
    folder = store.stream_folder(clip.source_id)
    folder.mkdir(parents=True, exist_ok=True)
    clip_id = store.new_clip_id(clip.source_id, first.arrival)
    name = f"{clip_id}{SUFFIX[container]}"
    tmp = folder / f".{name}.tmp"
    try:
        duration = _remux(clip.packets, template, tmp, container)
        info = ClipInfo(
            clip_id=clip_id,
            source_id=clip.source_id,
            file=name,
            start_time=first.arrival,
            end_time=last.arrival,
            duration_s=duration,
            frames=len(clip.packets),
            bytes=tmp.stat().st_size,
            codec=template.codec,
            events=clip.events,
        )
        store.commit(info, tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return info


def _remux(packets: Sequence[RingPacket], template: _Template, path: Path, container: str) -> float:
    """Write `packets` with their own timestamps (shifted so that the clip starts at 0 and
    kept increasing across a looped file's restarts); returns the duration in seconds."""
    time_base = template.time_base
    start = _stamp(packets[0])
    offset = -start
    last_dts: int | None = None
    end = 0
    with av.open(str(path), "w", format=container) as output:
        stream = output.add_stream_from_template(template.stream)
        stream.time_base = time_base
        for packet in packets:
            dts = packet.dts if packet.dts is not None else packet.pts
            pts = packet.pts if packet.pts is not None else dts
            if dts is None or pts is None:
                continue
            if last_dts is not None and dts + offset <= last_dts:  # timestamps went back
                offset = last_dts + max(1, packet.duration) - dts
            out = av.Packet(packet.data)
            out.dts, out.pts = dts + offset, pts + offset
            out.duration = packet.duration
            out.time_base = time_base
            out.is_keyframe = packet.keyframe
            out.stream = stream
            output.mux(out)
            last_dts = dts + offset
            end = max(end, pts + offset + packet.duration)
    return float(end * time_base)


def _stamp(packet: RingPacket) -> int:
    value = packet.dts if packet.dts is not None else packet.pts
    return value if value is not None else 0


class ClipRecorder:
    """One stream's pre-roll ring and its clip in progress (module docstring)."""

    def __init__(
        self,
        source_id: str,
        settings: ClipSettings,
        writer: ClipWriter,
        class_names: Sequence[str],
    ) -> None:
        self.source_id = source_id
        self.settings = settings
        self._writer = writer
        self._names = tuple(class_names)
        self._ring = PacketRing(settings.pre_roll_s, settings.ring_max_bytes)
        self._template: _Template | None = None
        self._unusable: Any = None  # a connection's stream that could not be templated
        self._last_end: float | None = None  # arrival of the last clip's last packet
        self._clip: _OpenClip | None = None
        self._lock = threading.Lock()
        self._types = None if settings.events is None else frozenset(settings.events)
        self._zones = None if settings.zones is None else frozenset(settings.zones)
        self._classes = None if settings.classes is None else frozenset(settings.classes)
        self.enabled = settings.streams is None or source_id in settings.streams

    @property
    def ring_bytes(self) -> int:
        return self._ring.bytes

    def on_packet(self, packet: Any, arrival: float) -> None:
        """A demuxed video packet (the source thread's; its bytes are copied)."""
        if not self.enabled or packet.size == 0:
            return
        kept = RingPacket(
            data=bytes(packet),
            pts=packet.pts,
            dts=packet.dts,
            duration=int(packet.duration or 0),
            keyframe=bool(packet.is_keyframe),
            arrival=arrival,
        )
        with self._lock:
            if packet.stream is self._unusable:
                return
            if self._template is None or self._template.source is not packet.stream:
                try:
                    self._new_connection(packet.stream)
                except Exception as exc:  # a stream PyAV cannot copy: no clips, never no video
                    log.error("clips of %s: cannot record this stream: %s", self.source_id, exc)
                    self._unusable = packet.stream
                    self._template = None
                    return
            self._ring.add(kept)
            clip = self._clip
            if clip is None:
                return
            if arrival > clip.end:
                self._finish_locked()
            else:
                clip.packets.append(kept)

    def on_events(self, events: Sequence[ZoneEvent], arrival: float) -> None:
        """A result's zone and line events (the publisher thread's); `arrival` is its frame's."""
        if not self.enabled:
            return
        kept = [
            ClipEvent(
                type=e.type,
                zone=e.zone,
                class_name=self._class_name(e.class_id),
                track_id=e.track_id,
                time=arrival,
                direction=e.direction,
            )
            for e in events
            if (self._types is None or e.type in self._types)
            and (self._zones is None or e.zone in self._zones)
            and (self._classes is None or self._class_name(e.class_id) in self._classes)
        ]
        if not kept:
            return
        with self._lock:
            end = arrival + self.settings.post_roll_s
            clip = self._clip
            if clip is not None and arrival <= clip.end:
                # Within the clip: it runs on to post_roll_s after this one, up to max_clip_s
                # from its first packet (the rest of that post-roll is the next clip's).
                clip.end = max(clip.end, min(end, clip.started + self.settings.max_clip_s))
                clip.events.extend(kept)
                return
            if clip is not None:
                self._finish_locked()
            if self._template is None:
                return  # no packet yet: nothing to cut
            packets = self._ring.since(arrival - self.settings.pre_roll_s, after=self._last_end)
            if not packets:
                return
            self._clip = _OpenClip(
                self._template, packets, end=end, started=packets[0].arrival, events=kept
            )

    def close(self) -> None:
        """The stream stops: a clip in progress is written with what it has."""
        with self._lock:
            self._finish_locked()
            self._ring.clear()

    def _class_name(self, class_id: int) -> str:
        names = self._names
        return names[class_id] if 0 <= class_id < len(names) else str(class_id)

    def _new_connection(self, stream: Any) -> None:
        """A new connection (or the first): its packets cannot follow the last one's."""
        self._finish_locked()
        self._ring.clear()
        self._last_end = None
        self._template = _Template(stream)

    def _finish_locked(self) -> None:
        clip, self._clip = self._clip, None
        if clip is None or not clip.packets:
            return
        self._last_end = clip.packets[-1].arrival
        self._writer.submit(FinishedClip(self.source_id, clip.template, clip.packets, clip.events))
