"""`FleetControl`: the API's writes to the streams (`StreamControl`) as changes to the fleet's
desired state, which every node follows (vdet.fleet.node).

A stream is checked here as the node's own stream service would check it (URL policy, class
names, thresholds, zones: `check`), so the API answers 422 at once with the same messages, and
an id that a fleet cannot hold is refused with its reason. The write itself is a
compare-and-set on the bucket: `add` creates the key (409 when it exists), `change` replaces
the revision it read (read again when another node's API changed it meanwhile), `remove`
deletes it. The answer shows the stream as this node sees it: running here, or as added.

The calls come from the API's worker threads and run on the event loop that holds the NATS
connection; one that NATS does not answer within `timeout_s` is `StreamUnavailableError` (503),
and what it asked for may or may not have happened (a retry of `add` then says 409).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from vdet.config.streams import StreamSpec
from vdet.core.types import SourceState, SourceStatus
from vdet.fleet.keys import key_problem
from vdet.fleet.store import FleetStore
from vdet.streams.service import (
    DuplicateStreamError,
    StreamChanges,
    StreamError,
    StreamService,
    StreamUnavailableError,
    StreamView,
    UnknownStreamError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_CHANGE_ATTEMPTS = 5


class FleetControl:
    """Writes go to the fleet's desired state (module docstring). `local`: this node's stream
    service (for the answer); `check(spec)`: raises ValueError for a stream it could not run;
    `pending(spec)`: the view of a stream not running here."""

    def __init__(
        self,
        store: FleetStore,
        loop: asyncio.AbstractEventLoop,
        local: StreamService,
        check: Callable[[StreamSpec], object],
        pending: Callable[[StreamSpec], StreamView],
        *,
        timeout_s: float = 10.0,
    ) -> None:
        self._store = store
        self._loop = loop
        self._local = local
        self._check = check
        self._pending = pending
        self._timeout_s = timeout_s

    def add(self, spec: StreamSpec) -> StreamView:
        self._checked(spec)
        value = spec.model_dump(mode="json", exclude={"id"})
        if self._call(self._store.create_spec(spec.id, value)) is None:
            raise DuplicateStreamError(f"stream {spec.id!r} already exists")
        return self._view(spec)

    def change(self, stream_id: str, changes: StreamChanges) -> StreamView:
        for _ in range(_CHANGE_ATTEMPTS):
            found = self._call(self._store.get_spec(stream_id))
            if found is None:
                raise UnknownStreamError(f"no stream {stream_id!r}")
            current, revision = found
            spec = changes.applied_to(StreamSpec.model_validate({**current, "id": stream_id}))
            self._checked(spec)
            value = spec.model_dump(mode="json", exclude={"id"})
            if self._call(self._store.update_spec(stream_id, value, revision)) is not None:
                return self._view(spec)
        raise StreamUnavailableError(
            f"stream {stream_id!r} kept changing under this change; try again"
        )

    def remove(self, stream_id: str) -> None:
        for _ in range(_CHANGE_ATTEMPTS):
            found = self._call(self._store.get_spec(stream_id))
            if found is None:
                raise UnknownStreamError(f"no stream {stream_id!r}")
            if self._call(self._store.delete_spec(stream_id, last=found[1])):
                return
        raise StreamUnavailableError(f"stream {stream_id!r} kept changing; try again")

    # -- plumbing ------------------------------------------------------------------------

    def _checked(self, spec: StreamSpec) -> None:
        if (problem := key_problem(spec.id)) is not None:
            raise ValueError(problem)
        self._check(spec)

    def _view(self, spec: StreamSpec) -> StreamView:
        try:
            view = self._local.get(spec.id)
        except StreamError:
            return self._pending(spec)
        return view if view.spec == spec else self._pending(spec)

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(self._timeout_s)
        except TimeoutError:
            future.cancel()
            raise StreamUnavailableError(
                f"the fleet's NATS servers did not answer within {self._timeout_s:g} s"
            ) from None
        except StreamError:
            raise
        except (ValueError, KeyError, TypeError) as exc:  # a stored value that is not a spec
            raise StreamUnavailableError(
                f"the fleet's stored stream is unreadable: {exc}"
            ) from None
        except Exception as exc:  # NATS errors: disconnected, no responders, ...
            raise StreamUnavailableError(f"the fleet's NATS servers: {exc}") from None


def pending_status() -> SourceStatus:
    """The status of a stream that is desired but not (yet) running on this node."""
    return SourceStatus(state=SourceState.CONNECTING)


__all__ = ["FleetControl", "pending_status"]
