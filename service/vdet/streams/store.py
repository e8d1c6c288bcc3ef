"""Streams as the API leaves them, kept in a file across restarts (setting `streams_file`).

After every change the API makes to the streams (add, change, zones, remove), each stream's
whole spec is written to the file, and the next start runs them again. The config file still
declares its sources, and it wins once it is edited: a configured source's API changes (and its
removal over the API) are kept only while the config file's entry for that source is what it
was when the API last changed it. Edit that entry (or drop it) and the config's version applies
again; the API's is forgotten. So clicks in the web page survive restarts, and an edited
config file is never overridden by older clicks.

This module owns the file's format (`StoredStream`, `StreamStore`), the decision of what starts
at start-up (`plan_startup`, pure) and the `StreamService` that writes after each change
(`PersistentStreams`). It never starts a stream itself: vdet.root does, in the plan's order.

The file: JSON `{"version": 1, "streams": [{"id", "spec", "configured"}, ...]}`, where `spec`
is the stream as running (null: a configured source the API removed) and `configured` the
config file's entry as it was at that change (null: a stream the API added). Written to a
temporary file beside it, flushed to disk and renamed over it, so a crash leaves the old file or
the new one, never a mix; readable by its owner only, as source URLs carry credentials.

One service per file: a running service holds `<file>.lock` (flock) and a second one pointed at
the same file (a copy of the compose service on the same volume, say) refuses to start, rather
than each overwriting the other's changes. The lock goes with the process, a killed one
included; the lock file itself stays and is harmless.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import logging
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vdet.config.streams import DetectionDefaults, StreamSpec
from vdet.core.types import Detections, ImageArray, StageTimings
from vdet.inference.postprocess import PostprocessParams
from vdet.ingest.urls import redact
from vdet.streams.event_snapshots import EventSnapshot, EventSnapshotCounts, EventSnapshotInfo
from vdet.streams.manager import StreamView

if TYPE_CHECKING:
    from vdet.root import StreamService
    from vdet.streams.pictures import EncodedFrame, Picture

log = logging.getLogger(__name__)

# A store of 1024 streams with 16 zones of 64 points each is well under 16 MiB; a larger file
# is not one we wrote, and is refused before it is read into memory.
MAX_STORE_BYTES = 16 * 1024 * 1024
STORE_VERSION: Literal[1] = 1


class StreamStoreError(RuntimeError):
    """The streams file cannot be read or written; the message names the file and why."""


class StoredStream(BaseModel):
    """One stream's entry: how it runs (`spec`; None: removed over the API) and the config
    file's entry for it when the API last changed it (`configured`; None: added over the API)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    spec: StreamSpec | None
    configured: StreamSpec | None

    @model_validator(mode="after")
    def _consistent(self) -> StoredStream:
        if self.spec is None and self.configured is None:
            raise ValueError("an entry needs a spec, a configured spec or both")
        for what, spec in (("spec", self.spec), ("configured", self.configured)):
            if spec is not None and spec.id != self.id:
                raise ValueError(f"{what}.id {spec.id!r} is not the entry's id {self.id!r}")
        return self


class _StoreFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1]
    streams: list[StoredStream] = Field(max_length=4096)


class StreamStore:
    """The streams file at `path`: `load` what the last run left, `save` what runs now."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def lock(self) -> None:
        """Hold the file for this process until `unlock` or its exit (module docstring).

        Raises StreamStoreError when another process holds it, naming that process as it wrote
        itself into the lock file (its pid and host name: in a container, the container's).
        """
        if self._lock_fd is not None:
            return
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StreamStoreError(f"cannot open {self.lock_path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            if isinstance(exc, BlockingIOError):
                raise StreamStoreError(
                    f"streams file {self.path} is in use by another vdet ({holder}); each "
                    "service needs a streams file of its own"
                ) from None
            raise StreamStoreError(f"cannot lock {self.lock_path}: {exc}") from None
        me = f"pid {os.getpid()} on {socket.gethostname()}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.encode() + b"\n", 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        """Let another service take the file (closing the descriptor drops the flock)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def load(self) -> dict[str, StoredStream]:
        """The entries by id, in the file's order; empty when there is no file yet.

        Raises StreamStoreError for a file that is too large, unreadable, not JSON, of another
        version or with invalid entries (the message says which and where): the service then
        refuses to start rather than start without the streams an operator set up.
        """
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_STORE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StreamStoreError(f"cannot read streams file {self.path}: {exc}") from None
        if len(raw) > MAX_STORE_BYTES:
            raise StreamStoreError(
                f"streams file {self.path} is over {MAX_STORE_BYTES} bytes: not one vdet wrote"
            )
        try:
            stored = _StoreFile.model_validate_json(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
                for err in exc.errors()[:5]
            )
            raise StreamStoreError(
                f"invalid streams file {self.path} ({problems}); fix or remove it"
            ) from None
        entries: dict[str, StoredStream] = {}
        for entry in stored.streams:
            if entry.id in entries:
                raise StreamStoreError(f"streams file {self.path}: stream {entry.id!r} twice")
            entries[entry.id] = entry
        return entries

    def check_writable(self) -> None:
        """Raise StreamStoreError unless the file's folder exists and takes new files."""
        folder = self.path.parent
        if not folder.is_dir():
            raise StreamStoreError(f"streams file {self.path}: folder {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise StreamStoreError(f"streams file {self.path}: folder {folder} is not writable")

    def save(self, entries: Iterable[StoredStream]) -> None:
        """Replace the file with `entries` in one step (module docstring). Raises OSError."""
        text = _StoreFile(version=STORE_VERSION, streams=list(entries)).model_dump_json(indent=1)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:  # mkstemp: mode 0600
                f.write(text + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _sync_folder(self.path.parent)


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (where the platform lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------- start-up


@dataclass(frozen=True)
class StartupStream:
    """A stream to start: `spec`, and the config file's entry for its id (`configured`), which
    is started instead when a spec from the file no longer starts."""

    spec: StreamSpec
    configured: StreamSpec | None
    from_file: bool


@dataclass(frozen=True)
class StartupPlan:
    streams: list[StartupStream]
    # Configured sources the API removed, while their config entries are unchanged: not
    # started, and still remembered as removed.
    removed: list[StoredStream]
    notes: list[str] = field(default_factory=list)  # what the file said that no longer applies


def plan_startup(
    configured: Sequence[StreamSpec], stored: Mapping[str, StoredStream]
) -> StartupPlan:
    """What to start: the configured sources (as the API left them while their config entry is
    unchanged), then the streams the API added, in the file's order."""
    streams: list[StartupStream] = []
    removed: list[StoredStream] = []
    notes: list[str] = []
    configured_ids = {spec.id for spec in configured}
    for spec in configured:
        entry = stored.get(spec.id)
        if entry is None:
            streams.append(StartupStream(spec, spec, from_file=False))
        elif entry.configured != spec:
            streams.append(StartupStream(spec, spec, from_file=False))
            why = "added over the API" if entry.configured is None else "changed over the API"
            notes.append(
                f"stream {spec.id!r}: the config file's entry applies; it changed since the "
                f"stream was {why}, so the streams file's version is dropped"
            )
        elif entry.spec is None:
            removed.append(entry)
        else:
            streams.append(StartupStream(entry.spec, spec, from_file=True))
    for entry in stored.values():
        if entry.id in configured_ids:
            continue
        if entry.configured is not None:
            notes.append(
                f"stream {entry.id!r}: no longer in the config file, so not started (the "
                "streams file's changes to it are dropped)"
            )
        elif entry.spec is not None:
            streams.append(StartupStream(entry.spec, None, from_file=True))
    return StartupPlan(streams, removed, notes)


# ------------------------------------------------------------------------ the service


class PersistentStreams:
    """A `StreamService` that writes the streams file after each change made through it.

    `inner` runs the streams; `configured` is the config file's entries by id; `removed`, the
    configured sources the API removed (from the start-up plan). Changes are serialised: each
    one, and the file it leaves, happen before the next begins, so the file always matches
    the streams. A failed write leaves the change in effect (it was made): it is logged and
    `on_save_failure` is called; the next change writes everything again.
    """

    def __init__(
        self,
        inner: StreamService,
        store: StreamStore,
        configured: Iterable[StreamSpec],
        removed: Iterable[StoredStream] = (),
        on_save_failure: Callable[[], object] = lambda: None,
    ) -> None:
        self.inner = inner
        self.store = store
        self._on_save_failure = on_save_failure
        self._configured = {spec.id: spec for spec in configured}
        self._removed = {entry.id: entry for entry in removed}
        # The specs as the changes leave them, so that writing the file asks no worker process.
        self._running = {view.spec.id: view.spec for view in inner.list()}
        self._changes = threading.Lock()

    def save(self) -> None:
        """Write what runs now (and the removed configured sources) to the file."""
        with self._changes:
            self._save()

    def _save(self) -> None:
        entries = [
            StoredStream(id=i, spec=spec, configured=self._configured.get(i))
            for i, spec in self._running.items()
        ]
        entries.extend(self._removed.values())
        try:
            self.store.save(entries)
        except OSError as exc:
            self._on_save_failure()
            log.error(
                "could not write the streams file %s: %s; the change is in effect but will not "
                "survive a restart until a later change is written",
                self.store.path,
                redact(str(exc)),
            )

    # --- StreamService: changes ---------------------------------------------------------------

    def add(self, spec: StreamSpec) -> StreamView:
        with self._changes:
            view = self.inner.add(spec)
            self._running[spec.id] = view.spec
            self._removed.pop(spec.id, None)
            self._save()
        return view

    def update_params(self, stream_id: str, **changes: Any) -> StreamView:
        with self._changes:
            view = self.inner.update_params(stream_id, **changes)
            self._running[stream_id] = view.spec
            self._save()
        return view

    def remove(self, stream_id: str) -> None:
        with self._changes:
            self.inner.remove(stream_id)
            self._running.pop(stream_id, None)
            if (configured := self._configured.get(stream_id)) is not None:
                self._removed[stream_id] = StoredStream(
                    id=stream_id, spec=None, configured=configured
                )
            self._save()

    # --- StreamService: the rest, as `inner` answers ------------------------------------------

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.inner.class_names

    @property
    def defaults(self) -> DetectionDefaults:
        return self.inner.defaults

    def list(self) -> builtins.list[StreamView]:
        return self.inner.list()

    def get(self, stream_id: str) -> StreamView:
        return self.inner.get(stream_id)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self.inner

    def __len__(self) -> int:
        return len(self.inner)

    def latest_jpeg(
        self,
        stream_id: str,
        *,
        boxes: bool = True,
        quality: int = 85,
        max_width: int | None = None,
        newest: bool = False,
        unless: Picture | None = None,
    ) -> EncodedFrame | None:
        return self.inner.latest_jpeg(
            stream_id,
            boxes=boxes,
            quality=quality,
            max_width=max_width,
            newest=newest,
            unless=unless,
        )

    def event_snapshot(self, stream_id: str, frame_index: int) -> EventSnapshot | None:
        return self.inner.event_snapshot(stream_id, frame_index)

    def event_snapshots(
        self, stream_id: str
    ) -> tuple[builtins.list[EventSnapshotInfo], EventSnapshotCounts]:
        return self.inner.event_snapshots(stream_id)

    def detect(
        self, image_bgr: ImageArray, params: PostprocessParams
    ) -> tuple[Detections, StageTimings]:
        return self.inner.detect(image_bgr, params)

    def sync_metrics(self) -> None:
        self.inner.sync_metrics()

    def describe(self) -> str:
        return f"{self.inner.describe()}; streams kept in {self.store.path}"

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.store.unlock()


__all__ = [
    "MAX_STORE_BYTES",
    "PersistentStreams",
    "StartupPlan",
    "StartupStream",
    "StoredStream",
    "StreamStore",
    "StreamStoreError",
    "plan_startup",
]
