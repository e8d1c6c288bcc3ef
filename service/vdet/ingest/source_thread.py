"""A supervised thread per source: connect, decode into the mailbox, and reconnect on failure.

Owns a source's reconnect state machine and its health numbers (`SourceStatus`):

    connecting --first frame--> streaming --no frame for stall_timeout_s--> stalled
         |                          |                                          |
         +--error / timeout-------> failed <--error, end of a live stream------+
                                     |                                         |
                                     +-----------> backoff <-------------------+
                                                     |
                                 exponential delay with jitter, capped --> connecting

    a file read to its end without `loop_files`   --> stopped (no reconnect)
    a file that cannot be opened or yields no frame --> failed, for good (no reconnect)
    stop()                                       --> stopped, from any state

It hands frames to a `FrameMailbox` and never waits for whoever reads them, except for a file
that is not paced (`realtime` off), whose every frame is detected: then it waits for the last
one to be taken. It does not decide which sources exist (the pipeline does) and does not
interpret frames.

Two daemon threads per source: the decoding thread, which makes all FFmpeg calls for its source,
and a watchdog that notices a connection making no progress (packets but no frames, or a call that
ignores its timeout), marks it and interrupts the blocking FFmpeg call. Reads are bounded by
FFmpeg/PyAV timeouts as well, so neither a stall nor `stop()` needs a thread to be killed.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import av

from vdet.config.ingest import IngestSettings
from vdet.core.rates import RateMeter
from vdet.core.redact import redact
from vdet.core.types import SourceState, SourceStatus
from vdet.ingest.mailbox import FrameMailbox
from vdet.ingest.reader import DamagedFrame, DecodeError, SourceReader
from vdet.ingest.urls import SourcePolicy, validate_source_url

log = logging.getLogger(__name__)

StateCallback = Callable[[str, SourceState, SourceState], None]
_ERRORS_KEPT = 16


class ReaderFactory(Protocol):
    """Makes the reader of one connection attempt: `SourceReader` itself (CPU decode), or
    a GPU device's choice between it and the NVDEC reader (vdet.ingest.nvdec_reader)."""

    def __call__(
        self,
        url: str,
        *,
        source_id: str,
        connect_timeout_s: float,
        read_timeout_s: float,
        loop: bool,
        realtime: bool,
        policy: SourcePolicy | None,
    ) -> SourceReader: ...


class Clock(Protocol):
    """What the source thread reads the time from; the `time` module is one."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...


# Each numeric option's default and bounds, and what it means, are the `ingest` setting's of the
# same name (vdet.config.ingest): one place for both, whether a source thread runs in a service
# or on its own.
_DEFAULTS = IngestSettings()


def _bounds(name: str) -> tuple[float, float]:
    low = high = None
    for rule in IngestSettings.model_fields[name].metadata:
        low = getattr(rule, "ge", low)
        high = getattr(rule, "le", high)
    assert low is not None and high is not None, name
    return low, high


_BOUNDED = tuple(
    name
    for name, spec in IngestSettings.model_fields.items()
    if spec.annotation in (float, int, "float", "int")
)


@dataclass(frozen=True)
class IngestOptions:
    """How one stream's source is opened, watched and reconnected: the `ingest` settings
    (vdet.config.ingest says what each means) and the stream's own choices. Bounds are checked
    on creation."""

    connect_timeout_s: float = _DEFAULTS.connect_timeout_s
    read_timeout_s: float = _DEFAULTS.read_timeout_s
    stall_timeout_s: float = _DEFAULTS.stall_timeout_s
    backoff_initial_s: float = _DEFAULTS.backoff_initial_s
    backoff_max_s: float = _DEFAULTS.backoff_max_s
    backoff_multiplier: float = _DEFAULTS.backoff_multiplier
    jitter: float = _DEFAULTS.jitter
    # Seek back to the start of a file at its end instead of stopping.
    loop_files: bool = False
    # Release a file's frames at its own frame rate, like a camera (newer frames replace those
    # detection has not taken). Off: as fast as detection takes them, every frame.
    realtime: bool = False
    max_consecutive_decode_errors: int = _DEFAULTS.max_consecutive_decode_errors
    pass_damaged_frames: bool = _DEFAULTS.pass_damaged_frames
    # The operator's allowed sources; None: any supported source.
    policy: SourcePolicy | None = None

    @classmethod
    def of(cls, settings: IngestSettings, *, loop_files: bool, realtime: bool) -> IngestOptions:
        """The options of one stream under `settings`."""
        return cls(
            **settings.model_dump(exclude={"source_policy"}),
            policy=SourcePolicy.of(settings.source_policy),
            loop_files=loop_files,
            realtime=realtime,
        )

    def __post_init__(self) -> None:
        for name in _BOUNDED:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
            low, high = _bounds(name)
            if not low <= value <= high:
                raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError(
                f"backoff_initial_s ({self.backoff_initial_s}) must not exceed "
                f"backoff_max_s ({self.backoff_max_s})"
            )


def backoff_delay(failures: int, options: IngestOptions, rng: random.Random) -> float:
    """Seconds to wait after `failures` consecutive failures (1 for the first one).

    ``initial * multiplier ** (failures - 1)``, spread by +-jitter, never above backoff_max_s.
    """
    exponent = max(0, failures - 1)
    try:
        base = options.backoff_initial_s * options.backoff_multiplier**exponent
    except OverflowError:
        base = options.backoff_max_s
    base = min(base, options.backoff_max_s)
    spread = 1.0 + rng.uniform(-options.jitter, options.jitter)
    return max(0.0, min(base * spread, options.backoff_max_s))


class SourceThread:
    """Keeps one source decoding into its mailbox, reconnecting until `stop()`.

    Counters in `status()`: ``attempts`` is every connection attempt since `start()`;
    ``reconnects`` counts the times frames flowed again after the source had streamed and
    been lost; ``frames_dropped`` is the mailbox's count of frames replaced unread, and
    ``frames_skipped`` of those its detect_fps let go;
    ``decode_errors`` and ``frames_damaged`` count rejected packets and frames of damaged
    reference chains. ``last_error`` (with ``last_error_time``) is the current problem: it
    is cleared when frames flow cleanly again (a reconnect streams, or an intact keyframe
    ends a damaged chain), and every error stays in ``recent_errors``. ``fps`` is measured
    over the last seconds, ``fps_nominal`` is what the source declares.

    It starts in ``connecting`` (no callback for that) once `start()` is called. The URL is
    checked with `validate_source_url` on construction (`ValueError` if rejected).

    The source thread closes its mailbox when it ends (after `stop()` or at the end of a file that
    does not loop); a consumer still gets the last frame, then None.

    `on_state_change(source_id, old, new)` is called after each transition, from whichever
    thread made it (the decoding thread, the watchdog or the one calling `stop()`); it must be
    quick and must not call back into `stop()`.
    """

    def __init__(
        self,
        source_id: str,
        url: str,
        mailbox: FrameMailbox,
        options: IngestOptions | None = None,
        clock: Clock = time,
        *,
        on_state_change: StateCallback | None = None,
        rng: random.Random | None = None,
        history_size: int = 32,
        reader_factory: ReaderFactory = SourceReader,
        packet_tap: Callable[[Any, float], None] | None = None,
    ) -> None:
        self.source_id = source_id
        self.url = url
        self.mailbox = mailbox
        self.options = options or IngestOptions()
        self._open_url = validate_source_url(url, self.options.policy)
        self._clock = clock
        self._on_state_change = on_state_change
        self._rng = rng or random.Random()
        self._reader_factory = reader_factory
        self._packet_tap = packet_tap  # the clip recorder's (vdet.clips), set on each reader

        self._lock = threading.Lock()
        self._status = SourceStatus()
        self._history: collections.deque[str] = collections.deque(maxlen=history_size)
        self._errors: collections.deque[str] = collections.deque(maxlen=_ERRORS_KEPT)
        self._decoded_rate = RateMeter()
        self._chain_damaged = False  # frames are being dropped until the next keyframe
        self._gave_up = False  # a permanent failure: the source ended in `failed`
        self._decode_errors = 0
        self._failures = 0  # consecutive, for the backoff; reset by a decoded frame
        self._has_streamed = False
        self._next_index = 0

        # The current connection, guarded by _lock.
        self._reader: SourceReader | None = None
        self._conn_started = 0.0
        self._conn_opened: float | None = None
        self._last_frame_mono = 0.0
        self._conn_aborted: str | None = None  # why the watchdog cut the connection

        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ingest-{source_id}", daemon=True)
        self._watchdog = threading.Thread(
            target=self._watch, name=f"ingest-watchdog-{source_id}", daemon=True
        )

    # ----------------------------------------------------------------- public API

    def start(self) -> None:
        """Start connecting in the background; returns at once."""
        self._append_history(None, SourceState.CONNECTING, "started")
        self._thread.start()
        self._watchdog.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop from any state within `timeout` seconds; True if the threads have ended.

        A blocking connect or read is interrupted rather than waited for. If the decoding
        thread still has not returned (an FFmpeg call ignoring interrupts), the source is
        reported stopped anyway and delivers nothing more; its daemon thread ends when the
        call's own timeout expires.
        """
        self._stop.set()
        with self._lock:
            reader = self._reader
        if reader is not None:
            reader.interrupt()
        deadline = time.monotonic() + max(0.0, timeout)
        for thread in (self._thread, self._watchdog):
            if thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        ended = not self._thread.is_alive() and not self._watchdog.is_alive()
        if not ended:
            log.warning(
                "source %s: decoding thread did not end within %.1f s", self.source_id, timeout
            )
        self.mailbox.close()
        self._transition(SourceState.STOPPED, "stopped")
        return ended

    def status(self) -> SourceStatus:
        """A snapshot; changing it changes nothing here."""
        with self._lock:
            snapshot = dataclasses.replace(
                self._status,
                history=list(self._history),
                recent_errors=list(self._errors),
                fps=self._decoded_rate.rate(self._clock.monotonic()),
            )
        snapshot.frames_dropped = self.mailbox.dropped
        snapshot.frames_skipped = self.mailbox.skipped
        return snapshot

    @property
    def state(self) -> SourceState:
        with self._lock:
            return self._status.state

    @property
    def decode_errors(self) -> int:
        """Packets the decoder rejected, over the source thread's life."""
        with self._lock:
            return self._decode_errors

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the decoding thread to end (after `stop()` or the end of a file)."""
        self._thread.join(timeout)

    # ------------------------------------------------------------ decoding thread

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    attempt = self._status.attempts + 1
                self._transition(SourceState.CONNECTING, f"attempt {attempt}")
                finished = self._attempt()
                if self._stop.is_set() or self._gave_up:
                    break
                if finished:
                    self._transition(SourceState.STOPPED, "end of file")
                    break
                with self._lock:
                    self._failures += 1
                    failures = self._failures
                delay = backoff_delay(failures, self.options, self._rng)
                self._transition(SourceState.BACKOFF, f"retry in {delay:.2f} s")
                if self._stop.wait(delay):
                    break
        except BaseException:  # a bug here must not leave a source silently dead
            log.exception("source %s: decoding thread crashed", self.source_id)
            raise
        finally:
            self._done.set()
            self.mailbox.close()
            if not self._gave_up:
                self._transition(SourceState.STOPPED, "stopped")

    def _attempt(self) -> bool:
        """One connection, streamed until it ends; True when a file ended for good."""
        reader = self._reader_factory(
            self._open_url,
            source_id=self.source_id,
            connect_timeout_s=self.options.connect_timeout_s,
            read_timeout_s=self.options.read_timeout_s,
            loop=self.options.loop_files,
            realtime=self.options.realtime,
            policy=self.options.policy,
        )
        reader.packet_tap = self._packet_tap
        now = self._clock.monotonic()
        with self._lock:
            self._reader = reader
            self._conn_started = now
            self._conn_opened = None
            self._conn_aborted = None
            self._status.attempts += 1
        reader.pass_damaged_frames = self.options.pass_damaged_frames
        if self._stop.is_set():  # stop() may have missed this reader
            reader.interrupt()
        opened = False
        decoded_before = self._status.frames_decoded
        try:
            info = reader.open()
            opened = True
            with self._lock:
                self._conn_opened = self._clock.monotonic()
                self._status.width = info.width or self._status.width
                self._status.height = info.height or self._status.height
                self._status.fps_nominal = info.fps
            self._note_decoder(reader)
            log.info(
                "source %s: opened %s %dx%d fps=%s",
                self.source_id,
                info.codec,
                info.width,
                info.height,
                info.fps,
            )
            if self._stream(reader):
                return False
            if self._stop.is_set() or self._aborted():
                return False
            if reader.live:
                self._fail("end of stream")
                return False
            if self._status.frames_decoded == decoded_before:
                self._give_up("the file has no decodable video frame")
                return False
            return True
        except Exception as exc:
            if self._stop.is_set() or self._aborted():
                return False
            if opened and isinstance(exc, av.ExitError):
                self._transition(
                    SourceState.STALLED,
                    f"no data for {self.options.read_timeout_s:g} s",
                    error=f"read timed out after {self.options.read_timeout_s:g} s",
                )
            elif not reader.live and not opened:
                self._give_up(f"cannot open the file: {_describe(exc)}")
            elif not opened and self._timed_out(exc):
                self._fail(
                    f"connect timed out after {self.options.connect_timeout_s:g} s (the source "
                    f"did not answer; FFmpeg said {_describe(exc)})"
                )
            else:
                self._fail(_describe(exc))
            return False
        finally:
            with self._lock:
                self._reader = None
            reader.close()

    def _stream(self, reader: SourceReader) -> bool:
        """Move frames to the mailbox; True when it had to give up on this connection."""
        limit = self.options.max_consecutive_decode_errors
        damaged_before = False
        # A file not paced like a camera is analysed, not watched: every frame is detected,
        # decoding waiting for detection to take the last one (vdet.ingest.mailbox).
        keep_waiting = None if reader.live or self.options.realtime else self._wait_for_detection
        choice = reader.choice
        for item in reader.frames(first_index=self._next_index):
            if self._stop.is_set() or self._aborted():
                return True
            if reader.choice is not choice:  # a new sequence moved to another decoder
                choice = reader.choice
                self._note_decoder(reader)
            if isinstance(item, DamagedFrame):
                self._on_damaged_frame(item)
                damaged_before = True
                continue
            if isinstance(item, DecodeError):
                self._on_decode_error(item)
                if item.consecutive >= limit:
                    self._fail(f"{item.consecutive} consecutive decode errors: {item.message}")
                    return True
                continue
            self._next_index = item.index + 1
            width, height = item.size_wh
            with self._lock:
                status = self._status
                status.frames_decoded += 1
                status.last_frame_time = self._clock.time()
                status.width, status.height = width, height
                self._last_frame_mono = self._clock.monotonic()
                self._decoded_rate.add(self._last_frame_mono)
                if self._chain_damaged and not damaged_before:
                    # An intact keyframe: the damaged chain is over.
                    self._chain_damaged = False
                    status.last_error = status.last_error_time = None
                first = status.state is SourceState.CONNECTING
                recovered = first and self._has_streamed
                if first:
                    self._failures = 0
                    self._has_streamed = True
                    if recovered:
                        status.reconnects += 1
            if first:
                self._transition(
                    SourceState.STREAMING,
                    f"reconnected, {width}x{height}" if recovered else f"{width}x{height}",
                    expect=SourceState.CONNECTING,
                )
            damaged_before = False
            self.mailbox.put(item, keep_waiting=keep_waiting)
        return False

    def _note_decoder(self, reader: SourceReader) -> None:
        """Show the reader's decoder, and why the CPU, in the status (and its history when it
        changes)."""
        choice = reader.choice
        with self._lock:
            status = self._status
            before = status.decode_path
            changed = (before, status.decode_reason) != (choice.path, choice.reason)
            status.decode_path = choice.path
            status.decode_reason = choice.reason
            status.decode_reason_label = choice.label
            # Said when a GPU node decodes on the CPU, and when it moves back to NVDEC.
            note = choice.reason or ("back on NVDEC" if before == "cpu" else None)
            if changed and note is not None:
                self._history.append(f"{self._clock.time():.3f} decoder: {note}")
        if changed and note is not None:
            log.info("source %s: decoder: %s", self.source_id, note)

    def _wait_for_detection(self) -> bool:
        """Whether a lossless `put` should keep waiting for its frame to be taken: until the
        source stops. Waiting on detection is not a stalled source, so the watchdog's clock
        restarts while it lasts."""
        if self._stop.is_set() or self._aborted():
            return False
        with self._lock:
            self._last_frame_mono = self._clock.monotonic()
        return True

    def _on_damaged_frame(self, damaged: DamagedFrame) -> None:
        with self._lock:
            self._status.frames_damaged += 1
            first = not self._chain_damaged
            self._chain_damaged = True
            if first:
                self._record_error_locked(f"damaged frames: {damaged.message}")
        if first:
            log.warning("source %s: %s", self.source_id, damaged.message)

    def _record_error_locked(self, message: str) -> None:
        now = self._clock.time()
        self._status.last_error = message = redact(message)
        self._status.last_error_time = now
        self._errors.append(f"{now:.3f} {message}")

    def _timed_out(self, exc: Exception) -> bool:
        """Whether a failed open took its whole timeout: FFmpeg's interrupt then surfaces as
        an exit or, from RTSP's handshake, as "invalid data"."""
        with self._lock:
            took = self._clock.monotonic() - self._conn_started
        timeout_like = isinstance(exc, av.ExitError | av.InvalidDataError | TimeoutError)
        return timeout_like and took >= 0.9 * self.options.connect_timeout_s

    def _give_up(self, reason: str) -> None:
        """A file that cannot deliver: retrying will not change it, so end in `failed`."""
        self._gave_up = True
        self._fail(reason)

    def _on_decode_error(self, error: DecodeError) -> None:
        with self._lock:
            self._decode_errors += 1
            total = self._decode_errors
            self._status.decode_errors = total
            self._chain_damaged = True
            self._record_error_locked(f"decode error: {error.message}")
        if error.consecutive == 1 or total % 100 == 0:
            log.warning(
                "source %s: decode error (%d in total, %d in a row): %s",
                self.source_id,
                total,
                error.consecutive,
                error.message,
            )

    def _fail(self, reason: str) -> None:
        self._transition(SourceState.FAILED, reason, error=reason)

    def _aborted(self) -> bool:
        with self._lock:
            return self._conn_aborted is not None

    # --------------------------------------------------------------- watchdog

    def _watch(self) -> None:
        period = min(0.25, self.options.stall_timeout_s / 4)
        while not self._done.wait(period) and not self._stop.is_set():
            verdict = self._check_progress()
            if verdict is not None:
                reader, state, reason = verdict
                log.warning("source %s: %s; interrupting", self.source_id, reason)
                self._transition(state, reason, error=reason)
                reader.interrupt()

    def _check_progress(self) -> tuple[SourceReader, SourceState, str] | None:
        opts = self.options
        now = self._clock.monotonic()
        with self._lock:
            reader, state = self._reader, self._status.state
            if reader is None or self._conn_aborted is not None:
                return None
            verdict: tuple[SourceState, str] | None = None
            if state is SourceState.STREAMING:
                idle = now - self._last_frame_mono
                if idle > opts.stall_timeout_s:
                    verdict = (SourceState.STALLED, f"no frame for {idle:.1f} s")
            elif state is SourceState.CONNECTING:
                if self._conn_opened is not None:
                    idle = now - self._conn_opened
                    if idle > opts.stall_timeout_s:
                        verdict = (SourceState.STALLED, f"connected, no frame for {idle:.1f} s")
                else:
                    # Open and probe each have connect_timeout_s; allow both and a margin.
                    took = now - self._conn_started
                    if took > 2 * opts.connect_timeout_s + 1.0:
                        verdict = (SourceState.FAILED, f"connect hung for {took:.1f} s")
            if verdict is None:
                return None
            self._conn_aborted = verdict[1]
        return reader, verdict[0], verdict[1]

    # ------------------------------------------------------------ transitions

    def _transition(
        self,
        new: SourceState,
        reason: str,
        *,
        error: str | None = None,
        expect: SourceState | None = None,
    ) -> None:
        reason = redact(reason)
        with self._lock:
            old = self._status.state
            if old is SourceState.STOPPED or (expect is not None and old is not expect):
                return
            if error is not None:
                self._record_error_locked(error)
            elif new is SourceState.STREAMING:
                self._status.last_error = self._status.last_error_time = None
            if old is new:
                return
            self._status.state = new
            self._append_history_locked(old, new, reason)
        log.info("source %s: %s -> %s (%s)", self.source_id, old.value, new.value, reason)
        if self._on_state_change is not None:
            try:
                self._on_state_change(self.source_id, old, new)
            except Exception:
                log.exception("source %s: on_state_change failed", self.source_id)

    def _append_history(self, old: SourceState | None, new: SourceState, reason: str) -> None:
        with self._lock:
            self._append_history_locked(old, new, reason)

    def _append_history_locked(
        self, old: SourceState | None, new: SourceState, reason: str
    ) -> None:
        arrow = f"{old.value}->{new.value}" if old is not None else new.value
        self._history.append(f"{self._clock.time():.3f} {arrow}: {reason}")


def _describe(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    return redact(f"{type(exc).__name__}: {text}")
