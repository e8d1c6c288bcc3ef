"""A node's mirror of the fleet's three buckets, kept current by JetStream watchers.

`FleetView.start` opens one watcher per bucket (every key's latest value, then each change as
it happens, expiry purges included) and returns once all three have delivered what the
buckets held. Values from other nodes are input: one that does not parse is ignored (and
counted), never trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from vdet.fleet.placement import NodeState
from vdet.fleet.store import FleetStore, node_state_of, owner_of

log = logging.getLogger(__name__)

_GONE = ("DEL", "PURGE")


class FleetView:
    """desired: stream id -> spec bytes; owners: stream id -> (node id, revision);
    nodes: node id -> NodeState. Read them from the event loop that runs the watchers."""

    def __init__(self, store: FleetStore) -> None:
        self.store = store
        self.desired: dict[str, bytes] = {}
        self.owners: dict[str, tuple[str, int]] = {}
        # When this view last saw each lease written (monotonic): a lease renewed every third
        # of its period and not seen for longer than the period has expired, whether or not
        # the servers said so (a bucket that changed leader while keys expired can drop them
        # without the purge marker the watchers see).
        self.owner_seen: dict[str, float] = {}
        self.nodes: dict[str, NodeState] = {}
        self.node_seen: dict[str, float] = {}  # as `owner_seen`, for the nodes' heartbeats
        self.ignored = 0  # values that did not parse
        # False until every watcher has delivered what its bucket held, and again while the
        # watchers restart: an incomplete view must not be read as "nothing is desired".
        self.synced = False
        self.changed = asyncio.Event()
        # Called with a stream id when the desired state loses it (removed through any node).
        self.on_removed: Callable[[str], object] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._watchers: list[Any] = []

    async def start(self) -> None:
        buckets: list[tuple[Any, Callable[[Any], None]]] = [
            (self.store.streams, self._on_desired),
            (self.store.owners, self._on_owner),
            (self.store.nodes, self._on_node),
        ]
        ready = []
        for bucket, apply in buckets:
            watcher = await bucket.watchall()
            self._watchers.append(watcher)
            initial = asyncio.Event()
            ready.append(initial)
            self._tasks.append(asyncio.create_task(self._follow(watcher, apply, initial)))
        for initial in ready:
            await initial.wait()
        self.synced = True

    async def stop(self) -> None:
        self.synced = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for watcher in self._watchers:
            with contextlib.suppress(Exception):
                await watcher.stop()
        self._tasks.clear()
        self._watchers.clear()

    async def restart(self, timeout_s: float) -> None:
        """Watch again from what the buckets hold now (after a reconnect: a watcher's consumer
        may have lived on a server that is gone). The new watchers fill a view of their own;
        until it has everything the buckets held, this view goes on answering reads from what
        it had (not `synced`: nothing is claimed from it meanwhile), then takes the new one's
        content in one step, telling `on_removed` of the streams removed meanwhile. Raises
        when the buckets do not answer within `timeout_s` (the caller tries again later)."""
        self.synced = False
        fresh = FleetView(self.store)
        fresh.changed = self.changed
        try:
            await asyncio.wait_for(fresh.start(), timeout_s)
        except BaseException:
            await fresh.stop()
            raise
        gone = set(self.desired) - set(fresh.desired)
        old_tasks, old_watchers = self._tasks, self._watchers
        self.desired, self.owners, self.owner_seen = fresh.desired, fresh.owners, fresh.owner_seen
        self.nodes, self.node_seen = fresh.nodes, fresh.node_seen
        self.ignored += fresh.ignored
        self._tasks, self._watchers = fresh._tasks, fresh._watchers
        # The new watchers go on applying changes to `fresh`, whose dicts are now this view's:
        # removals are told from here on.
        fresh.on_removed = self._removed
        self.synced = True
        self.changed.set()
        for stream_id in sorted(gone):
            self._removed(stream_id)
        for task in old_tasks:
            task.cancel()
        for task in old_tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for watcher in old_watchers:
            with contextlib.suppress(Exception):
                await watcher.stop()

    def _removed(self, stream_id: str) -> None:
        if self.on_removed is not None:
            self.on_removed(stream_id)

    def owner(self, stream_id: str) -> str | None:
        found = self.owners.get(stream_id)
        return None if found is None else found[0]

    def live_owners(self, lease_s: float, now: float | None = None) -> dict[str, str]:
        """stream id -> node id of the leases seen written within `lease_s` (see `owner_seen`)."""
        now = time.monotonic() if now is None else now
        return {
            stream_id: node
            for stream_id, (node, _) in self.owners.items()
            if now - self.owner_seen.get(stream_id, now) <= lease_s
        }

    def live_nodes(self, ttl_s: float, now: float | None = None) -> dict[str, NodeState]:
        """The nodes seen heartbeating within `ttl_s` (a node heartbeats every third of it):
        a node gone quiet is gone, whether or not its entry's expiry reached this view."""
        now = time.monotonic() if now is None else now
        return {
            node_id: state
            for node_id, state in self.nodes.items()
            if now - self.node_seen.get(node_id, now) <= ttl_s
        }

    async def _follow(
        self, watcher: Any, apply: Callable[[Any], None], initial: asyncio.Event
    ) -> None:
        async for entry in watcher:
            if entry is None:  # the end of what the bucket held
                initial.set()
                continue
            apply(entry)
            self.changed.set()

    def _on_desired(self, entry: Any) -> None:
        if entry.operation in _GONE:
            if self.desired.pop(entry.key, None) is not None and self.on_removed is not None:
                self.on_removed(entry.key)
        else:
            self.desired[entry.key] = bytes(entry.value or b"")

    def _on_owner(self, entry: Any) -> None:
        if entry.operation in _GONE:
            self.owners.pop(entry.key, None)
            self.owner_seen.pop(entry.key, None)
            return
        node = owner_of(bytes(entry.value or b""))
        if node is None:
            self.ignored += 1
            return
        self.owners[entry.key] = (node, int(entry.revision))
        self.owner_seen[entry.key] = time.monotonic()

    def _on_node(self, entry: Any) -> None:
        if entry.operation in _GONE:
            self.nodes.pop(entry.key, None)
            self.node_seen.pop(entry.key, None)
            return
        state = node_state_of(bytes(entry.value or b""))
        if state is None or state.node_id != entry.key:
            self.ignored += 1
            return
        self.nodes[entry.key] = state
        self.node_seen[entry.key] = time.monotonic()


__all__ = ["FleetView"]
