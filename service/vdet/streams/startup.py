"""Start-up: which streams start, in what order, and what records the API's changes after.

The configured sources (`sources`) start first; with `streams_file`, as the API last left them
while their config entry is unchanged, then the streams the API added, in the file's order
(vdet.streams.store says why the config file wins once edited). `plan_startup` decides (pure);
`start_streams` starts them and, with a streams file, wraps the service's writes so that each
change is written down (vdet.streams.persistent). A stream from the file that no longer starts
gives way to its config entry, or is left out with an error in the log; a configured source
that does not start stops the start-up, naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vdet.config.streams import StreamSpec
from vdet.core.redact import redact
from vdet.ingest.urls import REFUSED_FILE, SourcePolicy, is_local_file, validate_source_url
from vdet.streams.persistent import PersistentControl
from vdet.streams.service import StreamControl, StreamService
from vdet.streams.store import StoredStream, StreamStore, StreamStoreError

log = logging.getLogger(__name__)


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


@dataclass
class Started:
    """What `start_streams` leaves: where the API's changes go (the service itself, or the
    persistent wrapper around it), the streams file's lock (released by `close`), and how many
    streams started from the config file and from the streams file."""

    control: StreamControl
    store: StreamStore | None = None
    configured: int = 0
    restored: int = 0

    def close(self) -> None:
        """Let another service take the streams file (after the streams have stopped)."""
        if self.store is not None:
            self.store.unlock()


class StartupError(RuntimeError):
    """A configured source or the streams file keeps the service from starting; the message
    says which and why."""


def check_startup(
    configured: Sequence[StreamSpec], streams_file: Path | None, policy: SourcePolicy
) -> None:
    """What can be checked before anything starts: every configured source's URL against the
    source policy, and the streams file's contents. Raises StartupError, so that `vdet serve`
    says what is wrong in one line instead of failing in the middle of its start-up."""
    for index, spec in enumerate(configured):
        try:
            validate_source_url(spec.url, policy)
        except ValueError as exc:
            raise StartupError(
                f"configured source {spec.id!r} (sources[{index}].url): "
                f"{_why_refused(spec.url, policy, exc)}"
            ) from None
    if streams_file is not None:
        try:
            StreamStore(streams_file).load()
        except StreamStoreError as exc:
            raise StartupError(str(exc)) from None


def _why_refused(url: str, policy: SourcePolicy, exc: ValueError) -> str:
    """Why the source policy refused a configured source, naming the setting to change. A
    client of the API is told less (REFUSED_FILE does not say whether a file exists); the
    operator who wrote the config file is told which."""
    try:
        checked = validate_source_url(url)  # the URL itself, without the policy
    except ValueError as plain:
        return redact(str(plain))
    if is_local_file(checked) and str(exc) == REFUSED_FILE:
        if not policy.allows_file(checked):
            roots = ", ".join(str(r) for r in policy.file_roots) or "none set"
            return (
                f"source file {redact(checked)} is outside ingest.source_policy.file_roots "
                f"({roots}); add its folder there"
            )
        return f"source file {redact(checked)} is not readable by this user"
    if "scheme" in str(exc):
        return f"{redact(str(exc))} (ingest.source_policy.schemes)"
    if "host" in str(exc):
        return f"{redact(str(exc))} (ingest.source_policy.hosts)"
    return redact(str(exc))


def start_streams(
    streams: StreamService,
    configured: Sequence[StreamSpec],
    streams_file: Path | None,
    *,
    on_save_failure: Callable[[], object] = lambda: None,
) -> Started:
    """Start the configured sources and, with `streams_file`, the streams kept there (module
    docstring). Raises StartupError naming a configured source that does not start, and
    StreamStoreError for a streams file that cannot be used."""
    if streams_file is None:
        started = Started(streams)
        _start_planned(streams, [StartupStream(s, s, from_file=False) for s in configured], started)
        return started
    store = StreamStore(streams_file)
    store.check_writable()
    store.lock()  # before reading: what it reads is then what no other service will change
    try:
        plan = plan_startup(configured, store.load())
        for note in plan.notes:
            log.info("streams file %s: %s", streams_file, note)
        started = Started(streams, store)
        _start_planned(streams, plan.streams, started)
        control = PersistentControl(
            streams,
            store,
            configured,
            running=[view.spec for view in streams.list()],
            removed=plan.removed,
            on_save_failure=on_save_failure,
        )
        control.save()  # what runs now, without what no longer applies
    except BaseException:
        store.unlock()
        raise
    started.control = control
    return started


def _start_planned(
    streams: StreamService, planned: Sequence[StartupStream], started: Started
) -> None:
    for item in planned:
        if not _start_one(streams, item):
            continue
        if item.from_file and item.configured is None:
            started.restored += 1
        else:
            started.configured += 1


def _start_one(streams: StreamService, item: StartupStream) -> bool:
    """Start one stream; a spec from the streams file that no longer starts (a changed source
    policy, a model without its classes) gives way to the config file's entry, or, for a stream
    the API had added, is left out with an error in the log (False)."""
    try:
        streams.add(item.spec)
        return True
    except Exception as exc:
        if not item.from_file:
            raise StartupError(f"configured source {item.spec.id!r}: {redact(str(exc))}") from exc
        log.error(
            "stream %r from the streams file does not start (%s); %s",
            item.spec.id,
            redact(str(exc)),
            "the config file's entry is started instead"
            if item.configured is not None
            else "left out",
        )
    if item.configured is None:
        return False
    return _start_one(streams, StartupStream(item.configured, None, from_file=False))
