"""The messages between the API process and a stream worker process, and the pipe they use.

One duplex `multiprocessing` pipe per worker carries everything: control calls one way, their
replies and every published result the other. Messages are small frozen dataclasses (each
control call a `Request` type of its own, typed by its answer), pickled by the pipe; frames never
cross it (a snapshot crosses as JPEG). A result is a flat tuple of what the API process uses for
every frame (its wire text, what its metrics count); the whole result stays in the worker.
Results travel in batches (`PublishedBatch`): whatever the worker's publisher thread took from
its queue at once goes as one message, so a result taken just before its stream's removal may
arrive after the reply that confirmed it; every result carries its stream's handle, and the API
process drops those of a stream it has removed (or replaced by a new stream of the same id).

This module only defines the wire; it starts no process and owns no stream.
"""

from __future__ import annotations

import dataclasses
import pickle
import struct
import threading
from multiprocessing.connection import Connection
from typing import Any, Generic, NamedTuple, TypeVar

from vdet.config.streams import StreamSpec
from vdet.core.contract import PostprocessParams
from vdet.core.types import DetectionResult, Detections, ImageArray, StageTimings
from vdet.metrics.registry import ResultObservation
from vdet.streams.event_snapshots import EventSnapshot
from vdet.streams.service import (
    BackendInfo,
    EncodedFrame,
    EventSnapshotList,
    Health,
    PictureRequest,
    StreamChanges,
    StreamView,
)

T = TypeVar("T", covariant=True)


class Request(Generic[T]):
    """A control call to a worker, answered with a `T` (or the exception it raised). One frozen
    dataclass per call, below: the worker dispatches on the type (vdet.workers.child), and the
    API process's `WorkerPool` reads the answer's type from the request's."""


@dataclasses.dataclass(frozen=True)
class AddStream(Request[StreamView]):
    """Start `spec`; its results carry `handle` (a new stream of the same id gets another)."""

    spec: StreamSpec
    handle: int


@dataclasses.dataclass(frozen=True)
class ListStreams(Request[list[StreamView]]):
    """Every stream of the worker."""


@dataclasses.dataclass(frozen=True)
class GetStream(Request[StreamView]):
    stream_id: str


@dataclasses.dataclass(frozen=True)
class ChangeStream(Request[StreamView]):
    stream_id: str
    changes: StreamChanges


@dataclasses.dataclass(frozen=True)
class RemoveStream(Request[None]):
    stream_id: str


@dataclasses.dataclass(frozen=True)
class TakePicture(Request[EncodedFrame | None]):
    stream_id: str
    request: PictureRequest


@dataclasses.dataclass(frozen=True)
class ListEventSnapshots(Request[EventSnapshotList]):
    stream_id: str


@dataclasses.dataclass(frozen=True)
class GetEventSnapshot(Request[EventSnapshot | None]):
    stream_id: str
    frame_index: int


@dataclasses.dataclass(frozen=True)
class DetectImage(Request[tuple[Detections, StageTimings]]):
    image_bgr: ImageArray
    params: PostprocessParams


@dataclasses.dataclass(frozen=True)
class ReportHealth(Request[Health]):
    """Every stream's source status and the GPU's use, for a metrics scrape."""


@dataclasses.dataclass(frozen=True)
class Rename(Request[None]):
    """The worker's new name: a spare that took a dead worker's place serves under its name."""

    name: str


@dataclasses.dataclass(frozen=True)
class Call:
    """API -> worker: a `Request`, answered by a `Reply` with the same `call_id`."""

    call_id: int
    request: Request[Any]


@dataclasses.dataclass(frozen=True)
class Stop:
    """API -> worker: stop every stream and exit."""


@dataclasses.dataclass(frozen=True)
class Ready:
    """Worker -> API, once: the model is loaded and calls are served."""

    pid: int
    backend: BackendInfo
    description: str


@dataclasses.dataclass(frozen=True)
class Fatal:
    """Worker -> API, instead of `Ready`: it could not start; `error` says why."""

    error: str


@dataclasses.dataclass(frozen=True)
class Reply:
    """Worker -> API: the outcome of a `Call`: its return value, or the exception it raised."""

    call_id: int
    ok: bool
    value: Any


class Published(NamedTuple):
    """Worker -> API: a result of the stream added with `handle`, in that stream's order.

    The API process does the same for each of thousands of results a second: number it, keep
    its wire text for the WebSocket feeds and GET detections, count it in the metrics. Those
    parts come as plain fields (a tuple unpickles in about 1 us). The result itself (its
    detection arrays and tracking) does not travel: nothing in the API process needs it whole,
    and pickling it cost the worker and the pipe for every frame."""

    handle: int
    source_id: str
    frame_index: int
    encoded_tail: str  # vdet.results.wire.encode_result_tail: the wire text after the seq
    observed: ResultObservation

    @classmethod
    def of(cls, handle: int, result: DetectionResult, encoded_tail: str) -> Published:
        return cls(
            handle,
            result.source_id,
            result.frame_index,
            encoded_tail,
            ResultObservation.of(result),
        )


class PublishedBatch(NamedTuple):
    """Worker -> API: results in the order the worker published them, sent as one message.

    A worker's publisher thread shares its interpreter with every stream's threads. Each
    `send` is a system call, and coming back from one means waiting for the GIL behind them
    (about 1 ms at a time under 64 unpaced streams on 8 processes). With one message per
    result that wait was paid per frame and capped a worker's relay near 450 results/s; a
    batch pays it once for however many results were waiting. At a paced load a batch is
    usually one result, so nothing waits for a batch to fill."""

    results: tuple[Published, ...]


class Channel:
    """One end of a worker pipe that several threads may send on (a pipe's `send` is not
    thread-safe: two pickles written at once would interleave)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()

    def send(self, message: object) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self.conn.send_bytes(data)

    def recv(self) -> object:
        """The next message; EOFError (or OSError) once the other end has gone."""
        return pickle.loads(self.conn.recv_bytes())

    def close(self) -> None:
        self.conn.close()


class MessageSplitter:
    """Splits the bytes read from a `Connection`'s file descriptor into its messages.

    `Connection.recv_bytes` reads a message's 4-byte header and its body with two system
    calls, each of which gives the GIL away and waits to take it back. A reader of thousands
    of messages a second that shares its process with a busy event loop then spends most of
    its time waiting for the GIL. Reading whatever has arrived in one call and splitting it
    here takes the GIL back once per read instead. The framing is `multiprocessing`'s own, as
    `Connection.send_bytes` writes it: a big-endian int32 length, or -1 and a uint64 length
    for a message over 2 GiB, then the body.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes of a message that has not arrived whole yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[object]:
        """The messages that `data` completes, unpickled, in order."""
        buffer = self._buffer
        buffer += data
        messages: list[object] = []
        offset, size = 0, len(buffer)
        while size - offset >= 4:
            (length,) = struct.unpack_from("!i", buffer, offset)
            header = 4
            if length == -1:
                if size - offset < 12:
                    break
                (length,) = struct.unpack_from("!Q", buffer, offset + 4)
                header = 12
            end = offset + header + length
            if end > size:
                break
            messages.append(pickle.loads(buffer[offset + header : end]))
            offset = end
        del buffer[:offset]
        return messages


def portable_error(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling (so the API process can re-raise its type), else a
    RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc
