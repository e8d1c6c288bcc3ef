"""`PersistentControl`: the writes to the streams (`StreamControl`) that also keep the streams
file (setting `streams_file`; vdet.streams.store owns its format and lock).

It wraps only the writes: reads go to the stream service directly and never wait for the file.
Changes are serialised: each one, and the file it leaves, happen before the next begins, so the
file always matches the streams. A failed write leaves the change in effect (it was made): it is
logged and counted (`on_save_failure`), and the next change writes everything again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from vdet.config.streams import StreamSpec
from vdet.core.redact import redact
from vdet.streams.service import StreamChanges, StreamControl, StreamView
from vdet.streams.store import StoredStream, StreamStore

log = logging.getLogger(__name__)


class PersistentControl:
    """`control`'s writes, each followed by the streams file written whole.

    `configured`: the config file's entries; `running`: the specs that run now; `removed`: the
    configured sources the API removed (from the start-up plan)."""

    def __init__(
        self,
        control: StreamControl,
        store: StreamStore,
        configured: Iterable[StreamSpec],
        *,
        running: Iterable[StreamSpec],
        removed: Iterable[StoredStream] = (),
        on_save_failure: Callable[[], object] = lambda: None,
    ) -> None:
        self.control = control
        self.store = store
        self._on_save_failure = on_save_failure
        self._configured = {spec.id: spec for spec in configured}
        self._removed = {entry.id: entry for entry in removed}
        # The specs as the changes leave them, so that writing the file asks no worker process.
        self._running = {spec.id: spec for spec in running}
        self._changes = threading.Lock()

    def add(self, spec: StreamSpec) -> StreamView:
        with self._changes:
            view = self.control.add(spec)
            self._running[spec.id] = view.spec
            self._removed.pop(spec.id, None)
            self._save()
        return view

    def change(self, stream_id: str, changes: StreamChanges) -> StreamView:
        with self._changes:
            view = self.control.change(stream_id, changes)
            self._running[stream_id] = view.spec
            self._save()
        return view

    def remove(self, stream_id: str) -> None:
        with self._changes:
            self.control.remove(stream_id)
            self._running.pop(stream_id, None)
            if (configured := self._configured.get(stream_id)) is not None:
                self._removed[stream_id] = StoredStream(
                    id=stream_id, spec=None, configured=configured
                )
            self._save()

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
