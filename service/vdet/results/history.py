"""The event history: the zone and line events of every stream, newest last, kept in memory
up to a count (`hub.event_history`), for GET /v1/events/history and the web page's event
list. Fed on the publishing threads (`ResultsHub.add_observer`: every result, at the cost of
a substring check for the many without events); queried by filters and paged, newest first."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from vdet.results.hub import HubResult
from vdet.results.wire import result_with_events


@dataclass(frozen=True)
class EventRecord:
    """One zone or line event, with the result it came with. `id` numbers the events in the
    order kept (several events of one result share its seq): the paging cursor."""

    id: int
    seq: int
    source_id: str
    frame_index: int
    time: float  # unix time the frame's last packet was read
    type: str
    zone: str
    class_id: int
    class_name: str
    track_id: int
    direction: str | None
    dwell_s: float | None


@dataclass(frozen=True)
class EventQuery:
    """What a page of the history holds: every filter given must match (sets: any of)."""

    streams: Collection[str] | None = None
    zones: Collection[str] | None = None
    types: Collection[str] | None = None
    classes: Collection[str] | None = None
    since: float | None = None
    until: float | None = None
    before_id: int | None = None  # the page after one that ended at this event
    limit: int = 50

    def matches(self, event: EventRecord) -> bool:
        return (
            (self.streams is None or event.source_id in self.streams)
            and (self.zones is None or event.zone in self.zones)
            and (self.types is None or event.type in self.types)
            and (self.classes is None or event.class_name in self.classes)
            and (self.since is None or event.time >= self.since)
            and (self.until is None or event.time < self.until)
            and (self.before_id is None or event.id < self.before_id)
        )


@dataclass(frozen=True)
class EventPage:
    events: list[EventRecord]  # newest first
    more: bool  # older events match too: ask again with before_id = the last one's id
    kept: int  # events held now, all streams


class EventHistory:
    """The newest `capacity` events; thread-safe (appended by the results reader, read by
    the routes' threads)."""

    def __init__(self, capacity: int, names: Sequence[str]) -> None:
        self._events: deque[EventRecord] = deque(maxlen=max(1, capacity))
        self._enabled = capacity > 0
        self._names = tuple(names)
        self._lock = threading.Lock()
        self._next_id = 1

    def add(self, result: HubResult) -> None:
        """Keep the events of `result`, if it has any (cheap for the many without)."""
        if not self._enabled:
            return
        body = result_with_events(result, self._names)
        if body is None:
            return
        with self._lock:
            for event in body["events"]:
                self._events.append(_record(self._next_id, body, event))
                self._next_id += 1

    def query(self, query: EventQuery) -> EventPage:
        found: list[EventRecord] = []
        more = False
        with self._lock:
            kept = len(self._events)
            for event in reversed(self._events):  # newest first; ids only grow
                if query.before_id is not None and event.id >= query.before_id:
                    continue
                if not query.matches(event):
                    continue
                if len(found) == query.limit:
                    more = True
                    break
                found.append(event)
        return EventPage(found, more, kept)


def _record(event_id: int, body: dict[str, Any], event: dict[str, Any]) -> EventRecord:
    return EventRecord(
        id=event_id,
        seq=int(body["seq"]),
        source_id=str(body["source_id"]),
        frame_index=int(body["frame_index"]),
        time=float(body["arrival_time"]),
        type=str(event["type"]),
        zone=str(event["zone"]),
        class_id=int(event["class_id"]),
        class_name=str(event["class_name"]),
        track_id=int(event["track_id"]),
        direction=event.get("direction"),
        dwell_s=event.get("dwell_s"),
    )
