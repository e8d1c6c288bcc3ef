"""Which zone and line events a sink (a webhook, the MQTT broker) gets: `EventFilter`, from
the settings' `events`, `streams`, `zones` and `classes`; every filter given must hold."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vdet.config.notify import EventFilterSettings


class EventFilter:
    """Which of a result's events one sink gets (None in the settings: all)."""

    def __init__(self, spec: EventFilterSettings) -> None:
        self.types = None if spec.events is None else frozenset(spec.events)
        self.streams = None if spec.streams is None else frozenset(spec.streams)
        self.zones = None if spec.zones is None else frozenset(spec.zones)
        self.classes = None if spec.classes is None else frozenset(spec.classes)

    def events(self, source_id: str, events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.streams is not None and source_id not in self.streams:
            return []
        return [
            e
            for e in events
            if (self.types is None or e["type"] in self.types)
            and (self.zones is None or e["zone"] in self.zones)
            and (self.classes is None or e["class_name"] in self.classes)
        ]


__all__ = ["EventFilter"]
