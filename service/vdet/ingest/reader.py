"""Opening one video source with PyAV and turning its packets into BGR frames.

Owns the FFmpeg side of ingest: which options a camera, stream or file is opened with, how
long a connect or a read may block, threaded decoding, conversion to BGR uint8, presentation
times in seconds, looping and real-time pacing of files. It knows nothing of reconnecting,
states or mailboxes (that is `source_thread.py`); a failure here is an exception for the caller.

Timeouts, as verified against PyAV 18.1 with FFmpeg 8:

- PyAV's ``av.open(..., timeout=(open_s, read_s))`` installs an FFmpeg interrupt callback: a
  blocking connect/probe (each of ``avformat_open_input`` and ``avformat_find_stream_info``)
  or a single ``av_read_frame`` is aborted after that many seconds (``av.ExitError``, or
  ``InvalidDataError`` when RTSP's handshake is cut). This works for every protocol.
- RTSP: ``timeout`` (microseconds) is the socket I/O timeout. ``stimeout`` no longer exists
  (removed in FFmpeg 5) and ``rw_timeout`` is ignored by RTSP; both are silently unused.
- HTTP(S): ``timeout`` and ``rw_timeout`` (microseconds) both bound socket I/O.

`SourceReader.interrupt()` aborts a blocking call at once from another thread, see
`_FFmpegInterrupts`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any, cast

import av
import av.container
import av.container.core
import numpy as np

from vdet.core.redact import redact
from vdet.core.types import ImageArray, VideoFrame
from vdet.ingest.decode_choice import DecodeChoice
from vdet.ingest.redirects import RedirectError, check_redirect, http_location
from vdet.ingest.reference_chain import ReferenceChain
from vdet.ingest.rtsp_relay import RtpLoss, RtspRelay
from vdet.ingest.urls import SourcePolicy, ffmpeg_whitelists, is_network_url

log = logging.getLogger(__name__)

# Files that fall this far behind their real-time schedule (a slow consumer of the thread, a
# suspended process) start a new schedule instead of bursting to catch up.
_MAX_PACING_LAG_S = 1.0
# How many packet read times are kept to find the one a decoded frame came from.
_ARRIVALS_KEPT = 128


class SourceError(Exception):
    """The source opened but cannot deliver video (no video stream, nothing decodable)."""


@dataclass(frozen=True)
class StreamInfo:
    """What the source reported when it was opened; sizes may be refined by decoded frames."""

    width: int
    height: int
    fps: float | None
    codec: str
    live: bool


@dataclass(frozen=True)
class DecodeError:
    """A packet the decoder rejected; `consecutive` counts errors since the last good frame."""

    message: str
    consecutive: int


@dataclass(frozen=True)
class DamagedFrame(DecodeError):  # noqa: N818 (a frame report, like DecodeError)
    """A decoded frame of a damaged reference chain: after a decode error, a packet the
    demuxer flagged corrupt or a frame the decoder flagged corrupt (its concealment of lost
    data), until the next intact keyframe. Dropped unless the reader passes damaged frames;
    then `passed` is True and the frame itself follows."""

    passed: bool = False


def microseconds(seconds: float) -> str:
    return str(max(1, round(seconds * 1_000_000)))


def open_options(url: str, read_timeout_s: float) -> dict[str, str]:
    """FFmpeg container options for `url` (see the module docstring for what was verified).

    Always FFmpeg's demuxer and protocol whitelists (`ffmpeg_whitelists`): a file or a
    stream must be video in a video container, whatever FFmpeg would otherwise make of it.
    """
    return {**_scheme_options(url, read_timeout_s), **ffmpeg_whitelists(url)}


def _scheme_options(url: str, read_timeout_s: float) -> dict[str, str]:
    scheme = url.split(":", 1)[0].lower() if is_network_url(url) else "file"
    if scheme in ("rtsp", "rtsps"):
        return {
            "rtsp_transport": "tcp",  # interleaved over the RTSP connection: no UDP loss
            # Video only: no audio over the link, and the video's pts is its RTP time (what
            # vdet.ingest.rtsp_relay's losses are told in; with a second stream FFmpeg would
            # move to the RTCP wall clock).
            "allowed_media_types": "video",
            "timeout": microseconds(read_timeout_s),
            # Do not hold probe packets back: a live view wants the newest data first.
            "fflags": "nobuffer",
            # Only used for UDP reordering; over TCP packets cannot arrive out of order.
            "max_delay": "0",
        }
    if scheme in ("http", "https"):
        return {
            "timeout": microseconds(read_timeout_s),
            "rw_timeout": microseconds(read_timeout_s),
            "fflags": "nobuffer",
            "reconnect": "0",  # the source thread reconnects, with backoff and a visible state
        }
    return {}


_MAX_DECODE_THREADS = 4


class _FFmpegInterrupts:
    """Lets any thread abort a blocking PyAV call that a given thread is making.

    PyAV offers no interrupt of its own, only its timeout: its FFmpeg interrupt callback
    (``interrupt_cb`` in ``av/container/core``) aborts when ``time.monotonic()`` has moved past
    the start of the blocking call by more than the timeout, and it looks ``time`` up in its
    module's globals on every poll (FFmpeg polls about every 100 ms while waiting on a
    socket). We give that module, and only it, a clock that runs like ``time.monotonic``
    except in a thread whose interruption was requested: there each reading is 1e9 s later
    than the previous one, so the next poll finds the timeout exceeded and FFmpeg returns
    ``AVERROR_EXIT``. Closing the container from another thread instead would free it under
    the reading thread. Without this hook (a PyAV that changed its internals) an interrupt
    only takes effect when the read or open timeout expires; `supported` says which.
    """

    _JUMP_S = 1e9

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._installed: bool | None = None
        # ident of a registered thread -> None (running normally) or its accumulated jump
        self._threads: dict[int, float | None] = {}

    @property
    def supported(self) -> bool:
        return self._install()

    def _install(self) -> bool:
        with self._lock:
            if self._installed is None:
                core: ModuleType = av.container.core
                current = getattr(core, "time", None)
                if current is time:
                    core.time = _InterruptibleClock(self)  # type: ignore[attr-defined]
                    self._installed = True
                else:
                    self._installed = isinstance(current, _InterruptibleClock)
                    if not self._installed:
                        log.warning(
                            "PyAV %s has no patchable clock; a stop or stall will wait "
                            "for the read timeout",
                            av.__version__,
                        )
            return self._installed

    def register(self) -> int:
        self._install()
        ident = threading.get_ident()
        self._threads[ident] = None
        return ident

    def unregister(self, ident: int) -> None:
        self._threads.pop(ident, None)

    def interrupt(self, ident: int) -> None:
        if ident in self._threads and self._threads[ident] is None:
            self._threads[ident] = 0.0

    def monotonic(self) -> float:
        now = time.monotonic()
        ident = threading.get_ident()
        jump = self._threads.get(ident)
        if jump is None:
            return now
        jump += self._JUMP_S
        self._threads[ident] = jump
        return now + jump


class _InterruptibleClock:
    """Stands in for the `time` module inside av.container.core; see `_FFmpegInterrupts`."""

    def __init__(self, owner: _FFmpegInterrupts) -> None:
        self._owner = owner

    def monotonic(self) -> float:
        return self._owner.monotonic()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


_interrupts = _FFmpegInterrupts()


def interrupt_supported() -> bool:
    """Whether `SourceReader.interrupt` aborts a blocking read at once (else: at its timeout)."""
    return _interrupts.supported


class SourceReader:
    """One open source: `open()`, iterate `frames()`, `close()`; one thread does all three.

    Only `interrupt()` may be called from another thread. Network sources (rtsp, rtsps, http,
    https) are `live`: their end of stream is the caller's failure to handle. Files end when
    read through, unless `loop`, when they seek back to the start and keep counting frame
    indexes and presentation times upward as a camera would. With `realtime`, packets of a
    file are released at the stream's own rate (by their timestamps), before their arrival
    time is taken, so a paced file looks to latency metrics like a camera.
    """

    def __init__(
        self,
        url: str,
        *,
        source_id: str = "",
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 5.0,
        loop: bool = False,
        realtime: bool = False,
        pass_damaged_frames: bool = False,
        policy: SourcePolicy | None = None,
    ) -> None:
        self.url = url
        self.policy = policy
        self.source_id = source_id
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.live = is_network_url(url)
        self.loop = loop and not self.live
        self.realtime = realtime and not self.live
        self.info: StreamInfo | None = None
        self.decode_errors = 0
        self.pass_damaged_frames = pass_damaged_frames
        self.damaged_frames = 0
        # The decoder of the current sequence and why (the NVDEC reader chooses per sequence;
        # vdet.ingest.nvdec_reader.select_reader says why a GPU node's stream is here).
        self.choice = DecodeChoice("cpu")
        self.loops_completed = 0
        # A paced file that fell more than _MAX_PACING_LAG_S behind restarts its schedule
        # from now: how often, and the media seconds it never caught up on.
        self.pacing_resets = 0
        self.pacing_lag_dropped_s = 0.0
        self._container: av.container.InputContainer | None = None
        # Through a relay that reads the RTP sequence numbers (vdet.ingest.rtsp_relay), for a
        # reader that has no decoder of its own to flag concealed losses (NVDEC's).
        self.watch_rtp = False
        self._relay: RtspRelay | None = None
        self._stream: av.VideoStream | None = None
        self._thread: int | None = None
        # Called with every video packet (size > 0) and its arrival time, on the demuxing
        # thread, before it is decoded: the stream's clip recorder copies it (vdet.clips).
        self.packet_tap: Callable[[av.Packet[Any], float], None] | None = None
        self._interrupted = threading.Event()

    def __enter__(self) -> SourceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def interrupted(self) -> bool:
        return self._interrupted.is_set()

    def open(self) -> StreamInfo:
        """Connect and probe; blocks up to about 2 x connect_timeout_s (connect, then probe)."""
        if self._container is not None:
            raise RuntimeError("reader is already open")
        self._thread = _interrupts.register()
        if self._interrupted.is_set():
            _interrupts.interrupt(self._thread)
        # A timeout makes PyAV's FFmpeg interrupt callback take the GIL on every I/O poll;
        # with dozens of sources those tiny GIL grabs queue behind each other (up to a switch
        # interval each) and demuxing collapses. Local files never block on I/O: no timeout,
        # no callback; `interrupt()` still stops them between packets.
        container = self._connect()
        self._container = container
        if not container.streams.video:
            raise SourceError(f"no video stream in {redact(self.url)}")
        stream = container.streams.video[0]
        # Frame and slice threads as the codec supports; frame threading adds a few frames
        # of delay but is what keeps 1080p H.264 real time on a couple of cores. FFmpeg's own
        # choice is a thread per core, and each frame thread holds a frame back: on a 16-core
        # GPU machine that was ~16 frames (0.5 s) of latency, so at most 4 threads.
        stream.codec_context.thread_type = "AUTO"
        stream.codec_context.thread_count = min(_MAX_DECODE_THREADS, os.cpu_count() or 1)
        self._stream = stream
        rate = stream.average_rate or stream.guessed_rate
        self.info = StreamInfo(
            width=int(stream.codec_context.width or 0),
            height=int(stream.codec_context.height or 0),
            fps=float(rate) if rate else None,
            codec=stream.codec_context.name,
            live=self.live,
        )
        return self.info

    def _connect(self) -> av.container.InputContainer:
        """The container of this source, redirects followed as vdet.ingest.redirects says:
        each target checked against the policy before it is contacted, at most
        `policy.max_redirects` of them."""
        url = self.url
        for hop in range(self.policy.max_redirects + 1 if self.policy is not None else 1):
            try:
                return self._open_container(url)
            except (av.FFmpegError, OSError):
                location = self._redirect_of(url)
                if location is None:
                    raise
            assert self.policy is not None
            if hop == self.policy.max_redirects:
                raise RedirectError(
                    f"{redact(url)} redirects to {redact(location)!r}: more than "
                    f"{self.policy.max_redirects} redirect(s) "
                    "(ingest.source_policy.max_redirects)"
                )
            url = check_redirect(url, location, self.policy)
            log.info("source %s: following a redirect to %s", self.source_id, redact(url))
        raise AssertionError("unreachable")

    def _open_container(self, url: str) -> av.container.InputContainer:
        # A timeout makes PyAV's FFmpeg interrupt callback take the GIL on every I/O poll;
        # with dozens of sources those tiny GIL grabs queue behind each other (up to a switch
        # interval each) and demuxing collapses. Local files never block on I/O: no timeout,
        # no callback; `interrupt()` still stops them between packets.
        timeout = (self.connect_timeout_s, self.read_timeout_s) if self.live else None
        options = open_options(url, self.read_timeout_s)
        target = url
        if self.live and url.lower().startswith("rtsp"):
            restricted = self.policy is not None and self.policy.hosts is not None
            if restricted or self.watch_rtp:
                self._close_relay()
                # With a policy vdet follows redirects itself, checked, through a new relay
                # (FFmpeg would resolve a relative one against the relay's address).
                self._relay = RtspRelay(
                    url,
                    self.connect_timeout_s,
                    refuse_redirects=self.policy is not None,
                    watch_rtp=self.watch_rtp,
                )
                target = self._relay.local_url
                options = open_options(target, self.read_timeout_s)
        elif self.policy is not None and self.live and url.lower().startswith("http"):
            options["max_redirects"] = "0"  # vdet follows them itself, checked
        return av.open(target, mode="r", container_options=options, timeout=timeout)

    def _redirect_of(self, url: str) -> str | None:
        """Where `url` redirected the failed open to, if it did and vdet checks redirects."""
        if self.policy is None or not self.live:
            return None
        if url.lower().startswith("http"):
            return http_location(url, self.connect_timeout_s)
        relay, self._relay = self._relay, None
        if relay is None:
            return None
        relay.close()
        return relay.location

    def _close_relay(self) -> None:
        relay, self._relay = self._relay, None
        if relay is not None:
            relay.close()

    def rtp_losses(self) -> list[RtpLoss]:
        """RTP packets lost on the way from an RTSP camera since the last call, when
        `watch_rtp` is set (vdet.ingest.rtsp_relay); else none are seen."""
        relay = self._relay
        return relay.take_losses() if relay is not None else []

    def frames(self, first_index: int = 0) -> Iterator[VideoFrame | DecodeError]:
        """Decoded frames (and decode errors, which do not end the iteration) until the end.

        A frame of a damaged reference chain (see `DamagedFrame`) is reported as one and, unless
        `pass_damaged_frames`, not yielded: the decoder's concealment of lost data is what a
        detector mistakes for objects. Its index is used up all the same, so indexes keep
        counting the source's frames. The chain is whole again at the next keyframe (an IDR
        or I picture) the decoder does not flag. Raises what PyAV raises for a failed read:
        `av.ExitError` when a read timed out or was interrupted, `OSError` subclasses for
        network errors. Ends normally at end of stream.
        """
        timeline = self._new_timeline()
        decoding = CpuDecoding(self, timeline, first_index)
        packets = self._video_packets(timeline)
        try:
            for packet, arrival in packets:
                yield from decoding.feed(packet, arrival)
        finally:
            packets.close()  # ends the demuxer, which restores PyAV's "no timeout" state

    def damaged_frame(self, index: int, damage: str, consecutive: int) -> DamagedFrame:
        """Count and report frame `index` of a damaged reference chain (either decoder)."""
        self.damaged_frames += 1
        action = "passed on" if self.pass_damaged_frames else "dropped"
        return DamagedFrame(
            f"frame {index} {action}: {damage}; its reference chain is damaged until the "
            "next keyframe",
            consecutive,
            passed=self.pass_damaged_frames,
        )

    def _new_timeline(self) -> _Timeline:
        _, stream = self._require_open()
        return _Timeline(
            time_base=stream.time_base or Fraction(1, 90_000),
            frame_period_s=1.0 / self.info.fps if self.info and self.info.fps else 1.0 / 30.0,
        )

    def _video_packets(
        self, timeline: _Timeline
    ) -> Generator[tuple[av.Packet[Any], float], None, None]:
        """The video stream's packets, each with its arrival (wall-clock) time, to decode.

        The one demux loop of every reader, so that what a frame's times mean does not depend
        on the decoder: it records each packet on `timeline` (the decoding loop asks it for
        its frames' times and counts them there), paces files when `realtime`, and with `loop`
        seeks back and starts a new `timeline` pass at the end of each. A size-0 packet closes
        every pass: the demuxer's end of stream, for the decoder to be drained; it is neither
        paced nor recorded. Ends when interrupted, or at the end of the source unless looping.
        Close it in a `finally`: that closes the demuxer, which restores PyAV's timeout state.
        """
        container, stream = self._require_open()
        pacer = _Pacer(self._interrupted, self._note_pacing_reset) if self.realtime else None
        while True:
            # PyAV's stubs say Iterator; it is a generator, and closing it matters.
            packets = cast("Generator[av.Packet[Any], None, None]", container.demux())
            try:
                for packet in packets:
                    if self._interrupted.is_set():
                        return
                    if packet.stream.index != stream.index:
                        continue
                    arrival = time.time()
                    if packet.size > 0:
                        if pacer is not None:
                            if not pacer.wait_until(timeline.due_seconds(packet)):
                                return
                            arrival = time.time()  # it arrives when it is released
                        timeline.record_packet(packet, arrival)
                        if self.packet_tap is not None:
                            self.packet_tap(packet, arrival)
                    yield packet, arrival
            finally:
                packets.close()  # restores PyAV's "no timeout" state before anything else

            if not self.loop or self._interrupted.is_set():
                return
            if timeline.pass_frames == 0:
                # Looping again would spin on a source that will never yield a frame.
                raise SourceError(f"a full pass over {self.url} decoded no frame")
            timeline.next_pass()
            container.seek(0)  # also flushes the decoder, which the size-0 packet drained
            self.loops_completed += 1

    def _note_pacing_reset(self, lag_s: float) -> None:
        self.pacing_resets += 1
        self.pacing_lag_dropped_s += lag_s

    def interrupt(self) -> None:
        """Abort a blocking open/read in the reading thread and end `frames()`; any thread."""
        self._interrupted.set()
        if self._thread is not None:
            _interrupts.interrupt(self._thread)

    def close(self) -> None:
        """Release the connection; call it from the thread that opened. Idempotent."""
        self._close_relay()
        container, self._container = self._container, None
        self._stream = None
        try:
            if container is not None:
                with contextlib.suppress(Exception):
                    container.close()
        finally:
            if self._thread is not None:
                _interrupts.unregister(self._thread)
                self._thread = None

    def _require_open(self) -> tuple[av.container.InputContainer, av.VideoStream]:
        if self._container is None or self._stream is None:
            raise RuntimeError("reader is not open")
        return self._container, self._stream


class CpuDecoding:
    """FFmpeg's decoding of a reader's video packets into BGR `VideoFrame`s: the CPU path.

    Feed it the reader's packets in order (`feed`); it yields frames and decode errors, and
    reports each frame of a damaged reference chain (`DamagedFrame`: after a decode error, a
    packet the demuxer flagged corrupt, an H.264 picture that follows lost reference pictures
    (`chain`, vdet.ingest.reference_chain) or a frame the decoder flagged corrupt, until the
    next keyframe the decoder does not flag), which it drops unless the reader passes
    damaged frames. A dropped frame's index is used up all the same, so indexes keep counting
    the source's frames. `index` is the next frame's index; the NVDEC reader shares it when a
    stream changes decoders.
    """

    def __init__(self, reader: SourceReader, timeline: _Timeline, first_index: int) -> None:
        self.reader = reader
        self.timeline = timeline
        self.index = first_index
        self.consecutive_errors = 0
        self.damage: str | None = None  # why the current reference chain is damaged
        # H.264 frame_num continuity, shared with the NVDEC path when the stream moves.
        self.chain = ReferenceChain()
        self._chain_pass = timeline.pass_index

    def chain_gap(self, data: bytes, extradata: bytes = b"") -> str | None:
        """Feed one H.264 access unit (Annex B, or length-prefixed when `extradata` is avcC)
        to the stream's `ReferenceChain`, restarted when a looped file begins a new pass; the
        damage reason when its picture follows lost reference pictures."""
        if self._chain_pass != self.timeline.pass_index:
            self._chain_pass = self.timeline.pass_index
            self.chain.restart()
        if extradata[:1] == b"\x01":
            return self.chain.feed_length_prefixed(data, extradata)
        return self.chain.feed_annex_b(data)

    def feed(self, packet: av.Packet[Any], arrival: float) -> Iterator[VideoFrame | DecodeError]:
        """Decode one packet (size 0: drain the frames held back) and yield what it gave."""
        reader = self.reader
        started = time.perf_counter()
        if packet.is_corrupt:
            self.damage = "the demuxer flagged a corrupt packet"
        context = packet.stream.codec_context if packet.size else None
        if context is not None and context.name == "h264":
            gap = self.chain_gap(bytes(packet), bytes(context.extradata or b""))
            if gap is not None:
                self.damage = gap
        try:
            decoded = packet.decode()
        except av.FFmpegError as exc:
            reader.decode_errors += 1
            self.consecutive_errors += 1
            self.damage = "a packet failed to decode"
            yield DecodeError(f"{type(exc).__name__}: {exc}", self.consecutive_errors)
            return
        yield from self._frames(decoded, started, arrival)

    def damaged(self, damage: str, pts: int | None, arrival: float) -> DamagedFrame:
        """Report the next frame as one of a damaged chain (either decoder's); unless damaged
        frames are passed, it is dropped: its index and time are used up here."""
        report = self.reader.damaged_frame(self.index, damage, self.consecutive_errors)
        if not self.reader.pass_damaged_frames:
            self.timeline.place_frame(pts, arrival)
            self.index += 1
        return report

    def drain(
        self, context: av.VideoCodecContext, arrival: float
    ) -> Iterator[VideoFrame | DecodeError]:
        """Yield the frames the decoder holds back and reset it: the stream moves to another
        decoder (its next packet, a keyframe, starts afresh if it comes back)."""
        started = time.perf_counter()
        try:
            decoded = context.decode(None)
        except av.FFmpegError:
            decoded = []
        context.flush_buffers()
        yield from self._frames(decoded, started, arrival)

    def _frames(
        self, decoded: list[Any], started: float, arrival: float
    ) -> Iterator[VideoFrame | DecodeError]:
        if not decoded:
            return
        reader = self.reader
        decode_share = (time.perf_counter() - started) / len(decoded)
        for frame in decoded:
            if not isinstance(frame, av.VideoFrame):
                continue
            if frame.is_corrupt:
                self.damage = "the decoder flagged the frame corrupt"
            elif frame.key_frame or frame.pict_type == av.video.frame.PictureType.I:
                self.damage = None
            if self.damage is not None:
                yield self.damaged(self.damage, frame.pts, arrival)
                if not reader.pass_damaged_frames:
                    continue
            convert_started = time.perf_counter()
            image: ImageArray = np.ascontiguousarray(
                frame.to_ndarray(format="bgr24"), dtype=np.uint8
            )
            convert_s = time.perf_counter() - convert_started
            pts_s, frame_arrival = self.timeline.place_frame(frame.pts, arrival)
            self.consecutive_errors = 0
            yield VideoFrame(
                source_id=reader.source_id,
                index=self.index,
                image_bgr=image,
                pts_seconds=pts_s,
                arrival_time=frame_arrival,
                decode_seconds=decode_share + convert_s,
            )
            self.index += 1


class _Pacer:
    """Releases media timestamps no faster than the wall clock; waits end on interrupt.

    Releases late by up to _MAX_PACING_LAG_S go at once (the reader catches up); one later
    than that restarts the schedule from now (`on_reset` gets the lag) rather than sending
    seconds of backlog in one burst.
    """

    def __init__(
        self, interrupted: threading.Event, on_reset: Callable[[float], None] | None = None
    ) -> None:
        self._interrupted = interrupted
        self._on_reset = on_reset
        self._anchor: tuple[float, float] | None = None  # (monotonic, media seconds)

    def wait_until(self, media_s: float) -> bool:
        now = time.monotonic()
        if self._anchor is None:
            self._anchor = (now, media_s)
            return not self._interrupted.is_set()
        target = self._anchor[0] + (media_s - self._anchor[1])
        if now - target > _MAX_PACING_LAG_S or media_s < self._anchor[1]:
            if media_s >= self._anchor[1] and self._on_reset is not None:
                self._on_reset(now - target)
            self._anchor = (now, media_s)
            return not self._interrupted.is_set()
        if target > now:
            return not self._interrupted.wait(target - now)
        return not self._interrupted.is_set()


class _Timeline:
    """Packet and frame times of one `frames()` call, continuous across the passes of a loop.

    Shared by the demux loop (`SourceReader._video_packets`), which records each packet and
    moves to the next pass, and the decoding loop, which turns each frame's pts into its times
    with `place_frame`. Timestamps of pass n are shifted by the length of passes 0..n-1, so a
    looped file counts time upward as a camera would.
    """

    def __init__(self, time_base: Fraction, frame_period_s: float) -> None:
        self.time_base = time_base
        # Integer numerator and denominator: `ts * num / den` is rounded once, exactly as
        # float(ts * time_base), without Fraction arithmetic (microseconds a packet).
        self._tb_num = time_base.numerator
        self._tb_den = time_base.denominator
        self.frame_period_s = frame_period_s
        self.pass_index = 0
        self.pass_frames = 0  # frames decoded in this pass (placed with `place_frame`)
        self._offset_s = 0.0  # what this pass adds to its timestamps: the earlier passes' length
        self._first_pts: int | None = None
        self._end_pts: int | None = None  # the largest pts + duration of this pass's packets
        self._last_due_s: float | None = None
        # pts -> wall-clock arrival of the packet: a decoder returns frames later, and in
        # display order, so a frame's arrival is looked up by its pts. Bounded by
        # _ARRIVALS_KEPT against packets whose frames never come out.
        self._arrivals: collections.OrderedDict[int, float] = collections.OrderedDict()

    def due_seconds(self, packet: av.Packet[Any]) -> float:
        """When `packet` is due, for pacing: its decode time (what orders packets), else its
        presentation time, else one frame after the previous packet."""
        ts = packet.dts if packet.dts is not None else packet.pts
        if ts is not None:
            due_s = self._seconds(ts) + self._offset_s
        elif self._last_due_s is not None:
            due_s = self._last_due_s + self.frame_period_s
        else:
            due_s = 0.0
        self._last_due_s = due_s
        return due_s

    def record_packet(self, packet: av.Packet[Any], arrival: float) -> None:
        """Note a packet of this pass (not the size-0 one) that arrived at `arrival`."""
        if packet.pts is None:
            return
        if self._first_pts is None or packet.pts < self._first_pts:
            self._first_pts = packet.pts
        end = packet.pts + (packet.duration or 0)
        self._end_pts = end if self._end_pts is None else max(self._end_pts, end)
        self._arrivals[packet.pts] = arrival
        if len(self._arrivals) > _ARRIVALS_KEPT:
            self._arrivals.popitem(last=False)

    def place_frame(self, pts: int | None, packet_arrival: float) -> tuple[float | None, float]:
        """A decoded frame's (pts in seconds, arrival time), counted as a frame of this pass.

        The arrival is that of the packet with the frame's pts; `packet_arrival` (the packet
        whose decoding released the frame) when that is unknown.
        """
        self.pass_frames += 1
        if pts is None:
            return None, packet_arrival
        pts_s = self._seconds(pts) + self._offset_s
        return pts_s, self._arrivals.pop(pts, packet_arrival)

    def _seconds(self, ticks: int) -> float:
        return ticks * self._tb_num / self._tb_den

    def next_pass(self) -> None:
        """Start the next pass, whose timestamps continue from where this one ended."""
        first, end = self._first_pts, self._end_pts
        if first is not None and end is not None and end > first:
            self._offset_s += self._seconds(end - first)
        else:  # no usable timestamps: the pass lasted its frames at the nominal rate
            self._offset_s += self.pass_frames * self.frame_period_s
        self.pass_index += 1
        self.pass_frames = 0
        self._first_pts = None
        self._end_pts = None
        self._last_due_s = None
        self._arrivals.clear()
