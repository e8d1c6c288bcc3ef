"""Where zone and line events go besides the WebSocket feeds: the `Notifier` reads every result
from the results hub and hands the events to the sinks of `notify` (vdet.notify.webhooks: HTTP
endpoints; vdet.notify.mqtt: a broker), each through its own `EventFilter`.

It reads the hub the way a WebSocket client of /v1/events does, on the API's event loop, from
the service's first result on (the streams start before the sinks can, and their first results
wait in the replay buffer), resuming after the last result it saw if it is ever cut off as
lagging; results that had left the replay buffer by then are counted in
`vdet_notify_results_missed_total`. Results without events (nearly all) cost a substring test
or an empty-tuple check (vdet.api.schemas.result_with_events).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from vdet.clips.store import ClipInfo, ClipStore, clip_path
from vdet.config.notify import EventFilterSettings, NotifySettings, WebhookSettings
from vdet.metrics.registry import Metrics
from vdet.notify.mqtt import MqttPublisher
from vdet.notify.webhooks import Webhook
from vdet.results.follow import follow_results
from vdet.results.hub import HubResult, ResultsHub
from vdet.results.wire import result_with_events
from vdet.streams.event_snapshots import snapshot_path

log = logging.getLogger(__name__)

# Reads results and hands each to the given callable until cancelled (a fleet's shared
# consumer, vdet.fleet.notifications).
Follow = Callable[[Callable[[HubResult], object]], Awaitable[None]]

# (stream id, frame index) -> that frame's event snapshot as JPEG, None when there is none.
SnapshotOf = Callable[[str, int], bytes | None]


class Notifier:
    """The hub's reader, every configured webhook and the MQTT publisher (module docstring)."""

    def __init__(
        self,
        settings: NotifySettings,
        hub: ResultsHub,
        metrics: Metrics,
        class_names: Sequence[str],
        *,
        snapshot_of: SnapshotOf | None = None,
        clips: ClipStore | None = None,
        follow: Follow | None = None,
    ) -> None:
        sinks: list[tuple[str, EventFilterSettings]] = [
            (f"notify.webhooks {spec.id!r}", spec) for spec in settings.webhooks
        ]
        if settings.mqtt is not None:
            sinks.append(("notify.mqtt", settings.mqtt))
        known = set(class_names)
        for where, spec in sinks:
            if spec.classes is not None and (unknown := sorted(set(spec.classes) - known)):
                raise ValueError(
                    f"{where}: unknown classes {unknown}; the model has {', '.join(class_names)}"
                )
        self._settings = settings
        self._hub = hub
        self._metrics = metrics
        self._names = tuple(class_names)
        # In a fleet: where the results to notify come from (each once per fleet), instead of
        # this node's hub, which has every node's results (vdet.fleet.notifications).
        self._follow = follow
        # With event snapshots: bodies name their frame's, and MQTT may publish it.
        self._snapshot_of = snapshot_of
        if settings.mqtt is not None and settings.mqtt.snapshots and snapshot_of is None:
            raise ValueError("notify.mqtt.snapshots needs event_snapshots.per_stream > 0")
        # Event frames whose snapshot goes to MQTT next: a short queue, the oldest dropped.
        self._snapshots_due: collections.deque[tuple[str, int]] = collections.deque(maxlen=8)
        self._snapshot_due = asyncio.Event()
        # One client per trust store: the system's CAs, or the `tls_ca_file` of a site's own
        # CA, each checked before any client exists (a missing or broken file stops the start
        # with its name). No webhook, no client (making one loads a trust store).
        trust = {spec.tls_ca_file: _trust(spec) for spec in settings.webhooks}
        # Redirects are not followed: an endpoint that moved is a failed delivery, not a
        # request to somewhere the operator never configured.
        self._clients = {
            ca_file: httpx.AsyncClient(follow_redirects=False, verify=verify)
            for ca_file, verify in trust.items()
        }
        self.webhooks = [
            Webhook(spec, self._clients[spec.tls_ca_file], metrics) for spec in settings.webhooks
        ]
        self.mqtt = None if settings.mqtt is None else MqttPublisher(settings.mqtt, metrics)
        self._reader: asyncio.Task[None] | None = None
        self._senders: list[asyncio.Task[None]] = []
        self._clips = clips  # with event clips: each finished one is announced

    def start(self) -> None:
        """Start reading results and sending (on the running event loop)."""
        if not self.webhooks and self.mqtt is None:
            return
        if self.mqtt is not None:
            self.mqtt.start()
        self._reader = asyncio.create_task(self._read(), name="notify-reader")
        self._senders = [
            asyncio.create_task(hook.run(), name=f"webhook-{hook.spec.id}")
            for hook in self.webhooks
        ]
        if self._clips is not None:
            self._senders.append(asyncio.create_task(self._watch_clips(), name="notify-clips"))
        if self.mqtt is not None and self.mqtt.spec.snapshots:
            self._senders.append(asyncio.create_task(self._send_snapshots(), name="mqtt-snapshots"))

    async def stop(self) -> None:
        """Stop reading; let waiting deliveries and messages go out for up to
        `shutdown_grace_s`; then drop (and count) what is left."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        grace = self._settings.shutdown_grace_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        waiting = self.webhooks if self._senders else []  # never started: nothing is sent
        while any(hook.pending for hook in waiting) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for task in self._senders:
            task.cancel()
        for task in self._senders:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._senders = []
        for hook in self.webhooks:
            hook.drop_pending()
        if self.mqtt is not None:
            await asyncio.to_thread(self.mqtt.stop, max(0.1, deadline - loop.time()))
        for client in self._clients.values():
            await client.aclose()

    async def _read(self) -> None:
        def missed(count: int) -> None:
            self._metrics.notify_results_missed.inc(count)
            log.warning("notify: %d result(s) left the replay buffer unseen", count)

        def lagging(after: int) -> None:
            log.warning("notify: the results reader fell behind; resuming after %d", after)

        if self._follow is not None:
            await self._follow(self._dispatch)
            return
        await follow_results(self._hub, self._dispatch, missed, lagging)

    def _dispatch(self, result: HubResult) -> None:
        body = result_with_events(result, self._names)
        if body is None:
            return
        events: list[dict[str, Any]] = body.pop("events")
        source = body["source_id"]
        frame_index = int(body["frame_index"])
        if self._snapshot_of is not None:
            path = snapshot_path(source, frame_index)
            body["snapshot"] = f"{self._settings.public_url or ''}{path}"
        for hook in self.webhooks:
            if kept := hook.filter.events(source, events):
                hook.offer({**body, "events": kept}, float(body["published_time"]))
        if self.mqtt is not None and (kept := self.mqtt.filter.events(source, events)):
            self.mqtt.publish(source, {**body, "events": kept})
            if self.mqtt.spec.snapshots:
                self._snapshots_due.append((source, frame_index))
                self._snapshot_due.set()

    async def _watch_clips(self) -> None:
        """Announce each event clip once it is complete: the clips folder is polled (every
        process of the node writes there) and a clip that appeared since the last look goes
        to the webhooks and MQTT whose filters its events pass, with its URL under
        `notify.public_url`. Clips there before the start are not announced again."""
        assert self._clips is not None
        store = self._clips
        seen = await asyncio.to_thread(store.ids)
        while True:
            await asyncio.sleep(CLIP_POLL_S)
            now = await asyncio.to_thread(store.ids)
            for source_id, clip_id in sorted(now - seen):
                found = await asyncio.to_thread(store.get, source_id, clip_id)
                if found is not None:
                    self._announce_clip(found[0])
            seen = now

    def _announce_clip(self, info: ClipInfo) -> None:
        events = [dataclasses.asdict(e) for e in info.events]
        url = f"{self._settings.public_url or ''}{clip_path(info.source_id, info.clip_id)}"
        body: dict[str, Any] = {
            "source_id": info.source_id,
            "clip": {
                "clip_id": info.clip_id,
                "url": url,
                "start_time": info.start_time,
                "end_time": info.end_time,
                "duration_s": info.duration_s,
                "bytes": info.bytes,
            },
        }
        for hook in self.webhooks:
            if kept := hook.filter.events(info.source_id, events):
                hook.offer({**body, "events": kept}, info.end_time)
        if self.mqtt is not None and (kept := self.mqtt.filter.events(info.source_id, events)):
            self.mqtt.publish_clip(info.source_id, {**body, "events": kept})

    async def _send_snapshots(self) -> None:
        """Fetch each due event snapshot (off the event loop: it may wait for its encoding, or
        ask a worker process) and publish it, one at a time."""
        assert self.mqtt is not None and self._snapshot_of is not None
        while True:
            await self._snapshot_due.wait()
            self._snapshot_due.clear()
            while self._snapshots_due:
                source, frame_index = self._snapshots_due.popleft()
                jpeg = await asyncio.to_thread(self._snapshot_of, source, frame_index)
                if jpeg is not None:  # else skipped, or its stream is gone
                    self.mqtt.publish_snapshot(source, jpeg)


def _trust(spec: WebhookSettings) -> ssl.SSLContext | bool:
    """What a webhook's HTTPS is checked against: the system's CAs (True) or its CA file alone.
    Raises ValueError naming the webhook and the file when that file is no CA."""
    if spec.tls_ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(spec.tls_ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"notify.webhooks {spec.id!r}: tls_ca_file {spec.tls_ca_file}: {exc}"
        ) from exc


__all__ = ["Notifier", "SnapshotOf"]


# How often the clips folder is looked at for finished clips to announce.
CLIP_POLL_S = 1.0
