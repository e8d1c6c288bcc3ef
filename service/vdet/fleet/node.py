"""One node of the fleet: it says it is alive, claims streams, renews what it owns, runs them.

`FleetNode.run` loops every `tick_s` on its `FleetView`:
1. fencing, first: a lease not renewed for `lease_s - margin` (a node cut off from NATS, or
   one that was stopped and resumed) stops its stream before the servers can let another
   node take it, so a stream runs on two nodes at once for at most the time this loop takes
   to notice (its tick) after a pause, never a whole lease period;
2. heartbeat (every third of the node TTL): its `NodeState` in the node registry;
3. renew each lease it holds (every third of the lease period); a renewal refused means the
   lease is no longer its own: the stream stops here at once;
4. streams it owns that are no longer desired stop and their leases are released; a changed
   spec is applied (removed and added again);
5. claims: what `vdet.fleet.placement.to_claim` gives it, taken with compare-and-set and
   started through the node's `StreamControl` (its local streams or worker processes).

`stop(handoff=True)` drains: the node marks itself draining (no new claims anywhere go to it),
stops its streams, releases their leases so other nodes claim them at once, and leaves the
registry. Without a hand-off (a kill) the leases expire after `lease_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from vdet.config.streams import StreamSpec
from vdet.fleet.placement import NodeState, to_claim
from vdet.fleet.store import FleetOptions, FleetStore
from vdet.fleet.view import FleetView
from vdet.streams.service import StreamChanges, StreamControl, StreamError

log = logging.getLogger(__name__)

# A lease this close to its expiry without a renewal is given up here first (fencing).
_FENCE_MARGIN_FRACTION = 0.25
# The longest the watchers of the three buckets may take to start again after a reconnect.
_REWATCH_TIMEOUT_S = 15.0


@dataclass
class _Held:
    revision: int
    renewed: float  # monotonic time of the last renewal the servers accepted
    spec: bytes
    running: bool


class FleetNode:
    """One node's part in the fleet (module docstring). `control` runs the streams it owns;
    `on_event(kind, stream_id, detail)` hears what it does (claimed, started, lost, fenced,
    released, failed), for logs, metrics and tests."""

    def __init__(
        self,
        options: FleetOptions,
        store: FleetStore,
        control: StreamControl,
        on_event: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.options = options
        self.store = store
        self.view = FleetView(store)
        self.control = control
        self._on_event = on_event
        self.held: dict[str, _Held] = {}
        # Streams dropped here whose local stop is still under way: not claimed again meanwhile.
        self._removing: set[str] = set()
        self.draining = False
        self._stopping = asyncio.Event()
        self._last_heartbeat = float("-inf")
        self._last_renewal = float("-inf")
        self._rewatch: asyncio.Task[None] | None = None

    @property
    def node_id(self) -> str:
        return self.options.node_id

    def state(self) -> NodeState:
        return NodeState(self.node_id, self.options.capacity, self.draining)

    def holds(self, stream_id: str) -> bool:
        """Whether this node may publish for `stream_id` now: it holds the lease and renewed
        it recently enough that no other node can have taken it (vdet.fleet.results_bus)."""
        held = self.held.get(stream_id)
        return held is not None and time.monotonic() - held.renewed < self._fence_after

    @property
    def _fence_after(self) -> float:
        return self.store.lease_s * (1.0 - _FENCE_MARGIN_FRACTION)

    async def run(self) -> None:
        """Join and work until `stop`."""
        await self.view.start()
        # Fencing runs on its own as well: a tick can wait seconds on NATS (a renewal, the
        # watchers restarting while a server is gone), and no stream may run that long on a
        # stale lease meanwhile.
        fencer = asyncio.create_task(self._fence_every_tick(), name="fleet-fence")
        try:
            while not self._stopping.is_set():
                await self.tick()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.options.tick_s)
        finally:
            for task in (fencer, self._rewatch):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await self.view.stop()

    async def _fence_every_tick(self) -> None:
        while not self._stopping.is_set():
            await self._fence(time.monotonic())
            await asyncio.sleep(self.options.tick_s)

    async def tick(self) -> None:
        now = time.monotonic()
        await self._fence(now)  # first: after a pause, nothing runs on a stale lease
        rewatching = self._rewatch is not None and not self._rewatch.done()
        if (self.store.reconnected.is_set() or not self.view.synced) and not rewatching:
            # On its own task: heartbeats and renewals go on while the watchers restart (a
            # bucket electing a leader can take seconds), and reads keep the view they had.
            self.store.reconnected.clear()
            self._rewatch = asyncio.create_task(self._watch_again(), name="fleet-rewatch")
        if now - self._last_heartbeat >= self.store.node_ttl_s / 3:
            await self._guard(self.store.heartbeat(self.state()), "heartbeat")
            self._last_heartbeat = now
        if now - self._last_renewal >= self.store.lease_s / 3:
            await self._renew()
            self._last_renewal = now
        if self.view.synced:  # what is desired and owned is only known from a whole view
            await self._follow_desired()
            if not self.draining:
                await self._claim()

    async def _watch_again(self) -> None:
        try:
            await self.view.restart(_REWATCH_TIMEOUT_S)
        except Exception as exc:  # NATS not answering yet: the next tick tries again
            log.warning("fleet: watching the fleet again failed: %s", exc or type(exc).__name__)

    async def stop(self, handoff: bool = True) -> None:
        """Leave the fleet: with `handoff`, stop every stream and release its lease first."""
        if handoff:
            self.draining = True
            await self._guard(self.store.heartbeat(self.state()), "heartbeat")
            for stream_id in list(self.held):
                await self._drop(stream_id, "released", release=True)
            await self._guard(self.store.leave(self.node_id), "leave")
        self._stopping.set()

    # -- leases --------------------------------------------------------------------------

    async def _renew(self) -> None:
        for stream_id, held in list(self.held.items()):
            try:
                revision = await self.store.renew(stream_id, self.node_id, held.revision)
            except Exception as exc:  # NATS unreachable: fencing decides when to give up
                log.warning("fleet: renewing %s failed: %s", stream_id, exc)
                continue
            if self.held.get(stream_id) is not held:
                continue  # fenced while this renewal waited: a lease renewed now is taken back
            if revision is None:
                await self._drop(stream_id, "lost", release=False)
            else:
                held.revision, held.renewed = revision, time.monotonic()

    async def _fence(self, now: float) -> None:
        for stream_id, held in list(self.held.items()):
            if now - held.renewed >= self._fence_after and self.held.get(stream_id) is held:
                await self._drop(stream_id, "fenced", release=False)

    async def _claim(self) -> None:
        view = self.view
        await self._take_back()
        # A lease not seen renewed for a whole period has expired (FleetView.owner_seen): its
        # stream is claimable; the servers' compare-and-set still decides.
        owners = view.live_owners(self.store.lease_s)
        owners.update({s: self.node_id for s in self.held})
        # Likewise a node not seen heartbeating for its TTL: nothing is planned for it.
        nodes = view.live_nodes(self.store.node_ttl_s)
        nodes[self.node_id] = self.state()  # this node, whatever the registry shows yet
        for stream_id in to_claim(self.node_id, view.desired, owners, nodes):
            spec = view.desired.get(stream_id)
            if spec is None or stream_id in self._removing:
                continue
            try:
                revision = await self.store.claim(stream_id, self.node_id)
            except Exception as exc:
                log.warning("fleet: claiming %s failed: %s", stream_id, exc)
                return
            if revision is None:
                continue  # another node was first
            self.held[stream_id] = _Held(revision, time.monotonic(), spec, running=False)
            self._event("claimed", stream_id, str(revision))
            await self._start(stream_id)

    async def _take_back(self) -> None:
        """Streams this node fenced whose lease still names it at the revision the view shows
        (its renewals failed, say while the bucket elected a leader, but nobody took them):
        taken back with compare-and-set on that revision, and started again here."""
        for stream_id, (node, revision) in list(self.view.owners.items()):
            if node != self.node_id or stream_id in self.held or stream_id in self._removing:
                continue
            spec = self.view.desired.get(stream_id)
            if spec is None:
                continue
            try:
                renewed = await self.store.renew(stream_id, self.node_id, revision)
            except Exception as exc:
                log.warning("fleet: taking %s back failed: %s", stream_id, exc)
                return
            if renewed is None:
                continue  # expired or taken meanwhile: the placement decides
            self.held[stream_id] = _Held(renewed, time.monotonic(), spec, running=False)
            self._event("claimed", stream_id, f"{renewed} (taken back)")
            await self._start(stream_id)

    # -- the streams ---------------------------------------------------------------------

    async def _follow_desired(self) -> None:
        for stream_id, held in list(self.held.items()):
            spec = self.view.desired.get(stream_id)
            if spec is None:
                await self._drop(stream_id, "released", release=True)
            elif spec != held.spec:
                changes = _changes_between(held.spec, spec)
                held.spec = spec
                if changes is not None and held.running:
                    try:
                        await asyncio.to_thread(self.control.change, stream_id, changes)
                        self._event("changed", stream_id, "")
                        continue
                    except (StreamError, ValueError) as exc:
                        log.warning("fleet: changing %s in place failed: %s", stream_id, exc)
                await self._stop_local(stream_id)
                await self._start(stream_id)

    async def _start(self, stream_id: str) -> None:
        held = self.held[stream_id]
        try:
            spec = StreamSpec.model_validate({**json.loads(held.spec), "id": stream_id})
            await asyncio.to_thread(self.control.add, spec)
        except (StreamError, ValueError) as exc:
            # Kept: the lease says where the stream is and what went wrong (another node
            # would fail the same way).
            self._event("failed", stream_id, str(exc))
            return
        held.running = True
        self._event("started", stream_id, "")

    async def _stop_local(self, stream_id: str, held: _Held | None = None) -> None:
        """Stop the stream here if it runs (`held`: its entry, when already out of `held`);
        meanwhile it is not claimed again."""
        held = self.held.get(stream_id) if held is None else held
        if held is None or not held.running:
            return
        held.running = False
        self._removing.add(stream_id)
        try:
            with contextlib.suppress(StreamError):
                await asyncio.to_thread(self.control.remove, stream_id)
        finally:
            self._removing.discard(stream_id)

    async def _drop(self, stream_id: str, why: str, *, release: bool) -> None:
        # Out of `held` first: nothing of it is published from here on (`holds`), and a
        # second drop (the fencing task and the tick) finds nothing to do.
        held = self.held.pop(stream_id, None)
        if held is None:
            return
        await self._stop_local(stream_id, held)
        if release:
            await self._guard(self.store.release(stream_id, held.revision), "release")
        self._event(why, stream_id, "")

    # -- plumbing ------------------------------------------------------------------------

    async def _guard(self, call: Awaitable[object], what: str) -> None:
        try:
            await call
        except Exception as exc:
            log.warning("fleet: %s failed: %s", what, exc)

    def _event(self, kind: str, stream_id: str, detail: str) -> None:
        log.info("fleet node %s: %s %s %s", self.node_id, kind, stream_id, detail)
        if self._on_event is not None:
            self._on_event(kind, stream_id, detail)


def _changes_between(old: bytes, new: bytes) -> StreamChanges | None:
    """The `StreamChanges` that turn spec `old` into `new`, when only what a running stream
    can change differs (thresholds, classes, tracking, zones: applied from its next frame,
    its tracks kept); None when the stream must start again (its URL, say)."""
    try:
        before, after = json.loads(old), json.loads(new)
    except ValueError:
        return None
    if not isinstance(before, dict) or not isinstance(after, dict):
        return None
    changeable = set(StreamChanges.model_fields)
    for key in set(before) | set(after):
        if key not in changeable and before.get(key) != after.get(key):
            return None
    try:
        return StreamChanges.model_validate(
            {k: after.get(k) for k in changeable if before.get(k) != after.get(k)}
        )
    except ValueError:
        return None


__all__ = ["FleetNode"]
