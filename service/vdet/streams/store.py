"""Streams as the API leaves them, kept in a file across restarts (setting `streams_file`).

After every change the API makes to the streams (add, change, zones, remove), each stream's
whole spec is written to the file, and the next start runs them again. The config file still
declares its sources, and it wins once it is edited: a configured source's API changes (and its
removal over the API) are kept only while the config file's entry for that source is what it
was when the API last changed it. Edit that entry (or drop it) and the config's version applies
again; the API's is forgotten. So clicks in the web page survive restarts, and an edited
config file is never overridden by older clicks.

This module owns the file's format (`StoredStream`, `StreamStore`) and its lock; what starts from
it is vdet.streams.startup's to decide, and what writes it after each change,
vdet.streams.persistent's. It never starts a stream itself.

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

import contextlib
import fcntl
import logging
import os
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vdet.config.streams import StreamSpec

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
