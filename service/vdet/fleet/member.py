"""`FleetMember`: everything one `vdet serve` does as a node of a fleet, started and stopped as
one (by the composition root, vdet.root).

`join` connects to the fleet's NATS servers, makes the buckets and the results stream when the
fleet is new, seeds the configured sources into the desired state, turns the node's results
hub into a fleet feed (vdet.fleet.feed) and starts the node's loop (vdet.fleet.node), which
claims streams and runs them on this node's own stream service (in this process or its worker
processes). `leave` hands the streams off to the other nodes and disconnects.

Seeding follows the single node's rule for configured sources and the streams file: a
configured source is written to the desired state once, and again only when its entry in the
config file changes, so what the API did to it (changed, removed) survives restarts of any
node. The fleet remembers what it seeded in a fourth bucket, `<prefix>_seeded` (stream id ->
a hash of the configured spec).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from nats.js.api import KeyValueConfig
from nats.js.errors import KeyDeletedError, KeyNotFoundError

from vdet.config.cluster import ClusterSettings
from vdet.config.streams import StreamSpec
from vdet.core.types import DetectionResult
from vdet.fleet.feed import ResultsFeed
from vdet.fleet.node import FleetNode
from vdet.fleet.notifications import ensure_consumer, follow_notifications
from vdet.fleet.placement import NodeState
from vdet.fleet.results_bus import ResultsRetention, open_results
from vdet.fleet.store import FleetOptions, FleetStore
from vdet.results.hub import EncodedResult, ResultsHub
from vdet.streams.service import StreamControl

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """One node as the fleet sees it (GET /v1/nodes)."""

    node_id: str
    capacity: int
    draining: bool
    streams: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FleetInfo:
    """The fleet as this node sees it."""

    node_id: str  # this node
    nodes: tuple[NodeInfo, ...]
    unowned: tuple[str, ...]  # desired streams no live lease runs
    synced: bool  # False while this node's view is being rebuilt (after a reconnect)


def options_of(cluster: ClusterSettings, capacity: int) -> FleetOptions:
    return FleetOptions(
        servers=tuple(cluster.servers),
        node_id=cluster.node,
        capacity=capacity,
        lease_s=cluster.lease_s,
        node_ttl_s=cluster.lease_s,
        replicas=cluster.replicas,
        prefix=cluster.prefix,
        connect_timeout_s=cluster.connect_timeout_s,
    )


def connect_options(cluster: ClusterSettings) -> dict[str, Any]:
    """nats.connect's credentials and TLS from the settings."""
    found: dict[str, Any] = {}
    if cluster.username is not None and cluster.password is not None:
        found["user"] = cluster.username
        found["password"] = cluster.password.get_secret_value()
    if cluster.token is not None:
        found["token"] = cluster.token.get_secret_value()
    if cluster.creds_file is not None:
        found["user_credentials"] = str(cluster.creds_file)
    if cluster.tls_ca_file is not None or cluster.tls_cert_file is not None:
        import ssl

        context = ssl.create_default_context(
            cafile=str(cluster.tls_ca_file) if cluster.tls_ca_file else None
        )
        if cluster.tls_cert_file is not None and cluster.tls_key_file is not None:
            context.load_cert_chain(str(cluster.tls_cert_file), str(cluster.tls_key_file))
        found["tls"] = context
    return found


def seed_hash(spec: StreamSpec) -> bytes:
    text = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest().encode()


# A read asked of another node (`FleetMember.ask`), and its answer: one JSON line, then any
# bytes (a JPEG). Both bounded: a request is a few fields, an answer fits a NATS message.
_MAX_REQUEST_BYTES = 16 << 10
ReadAnswer = Callable[[str, dict[str, Any]], Awaitable[tuple[dict[str, Any], bytes]]]


@dataclasses.dataclass(frozen=True)
class Answer:
    """What another node answered: its JSON head and the bytes after it; `error` (and its
    HTTP `status`) when it refused, or did not answer (status 503)."""

    head: dict[str, Any]
    body: bytes = b""

    @property
    def error(self) -> str | None:
        value = self.head.get("error")
        return str(value) if value is not None else None

    @property
    def status(self) -> int:
        value = self.head.get("status", 200)
        return value if isinstance(value, int) and 100 <= value <= 599 else 502


class FleetMember:
    """One node's part in the fleet, joined (module docstring)."""

    def __init__(self, store: FleetStore, node: FleetNode, feed: ResultsFeed, prefix: str) -> None:
        self.store = store
        self.node = node
        self.feed = feed
        self.prefix = prefix
        self._task: asyncio.Task[None] | None = None
        self._reads: Any = None  # the subscription answering other nodes' reads
        self.notify_pending = 0  # the shared notification consumer's backlog, last seen

    @classmethod
    async def join(
        cls,
        cluster: ClusterSettings,
        capacity: int,
        local: StreamControl,
        hub: ResultsHub,
        encode: Callable[[DetectionResult], str],
        configured: Iterable[StreamSpec],
        *,
        replay: int,
        notifies: bool = False,
        on_event: Callable[[str, str, str], None] | None = None,
        on_ack: Callable[[float], object] | None = None,
    ) -> FleetMember:
        """Join (module docstring). `notifies`: this node sends webhooks or MQTT, so the
        fleet's shared notification consumer must exist before its streams start; `on_ack`:
        each published result's seconds to the servers' acknowledgement."""
        options = options_of(cluster, capacity)
        store = await FleetStore.open(options, connect_options(cluster))
        try:
            await open_results(
                store.js,
                options.prefix,
                ResultsRetention(
                    max_age_s=cluster.results_max_age_s,
                    max_bytes=cluster.results_max_bytes,
                    replicas=options.replicas,
                ),
            )
            if notifies:
                await ensure_consumer(store.js, options.prefix)
            await _seed(store, options.prefix, options.replicas, configured)
            node = FleetNode(options, store, local, on_event=on_event)
            loop = asyncio.get_running_loop()
            feed = ResultsFeed(
                store.js, options.prefix, hub, node.holds, encode, loop, on_ack=on_ack
            )
            await feed.start(replay)
        except BaseException:
            with contextlib.suppress(Exception):
                await store.close()
            raise
        hub.send_to(feed.outlet)
        node.view.on_removed = hub.forget_source
        member = cls(store, node, feed, options.prefix)
        member._task = asyncio.create_task(node.run(), name="fleet-node")
        log.info(
            "fleet: node %s joined %s (prefix %s, capacity %d, lease %g s)",
            options.node_id,
            ", ".join(options.servers),
            options.prefix,
            capacity,
            store.lease_s,
        )
        return member

    def holds(self, stream_id: str) -> bool:
        return self.node.holds(stream_id)

    def spec(self, stream_id: str) -> StreamSpec | None:
        """A stream of the fleet as desired (what any node's API shows and edits); None when
        the fleet has no such stream, or its stored spec is not one."""
        raw = self.node.view.desired.get(stream_id)
        if raw is None:
            return None
        try:
            return StreamSpec.model_validate({**json.loads(raw), "id": stream_id})
        except (ValueError, TypeError):
            log.warning("fleet: the desired spec of %s is not a stream spec", stream_id)
            return None

    async def follow_notifications(self, dispatch: Callable[[EncodedResult], object]) -> None:
        """Results to notify, each once per fleet (vdet.fleet.notifications)."""
        await follow_notifications(
            self.store.js, self.prefix, dispatch, on_pending=self._note_pending
        )

    def _note_pending(self, pending: int) -> None:
        self.notify_pending = pending

    def totals(self) -> dict[str, int]:
        """The results feed's running totals by outcome."""
        return self.feed.totals()

    # -- reads between nodes (NATS request/reply) ------------------------------------------

    def _read_subject(self, node_id: str) -> str:
        return f"{self.prefix}.read.{node_id}"

    async def serve_reads(self, answer: ReadAnswer) -> None:
        """Answer other nodes' reads of the streams this node runs with `answer(op, args)`
        (the API's, which knows its schemas)."""

        async def handle(msg: Any) -> None:
            try:
                if len(msg.data) > _MAX_REQUEST_BYTES:
                    raise ValueError("request too large")
                request = json.loads(msg.data)
                op, args = request["op"], request.get("args", {})
                if not isinstance(op, str) or not isinstance(args, dict):
                    raise ValueError("not a read request")
            except (ValueError, KeyError, TypeError) as exc:
                head, body = {"error": f"bad request: {exc}", "status": 400}, b""
            else:
                try:
                    head, body = await answer(op, args)
                except Exception as exc:  # answered, whatever went wrong here
                    log.exception("fleet: answering %s failed", op)
                    head, body = {"error": str(exc), "status": 500}, b""
            reply = json.dumps(head).encode() + b"\n" + body
            limit = self.store.client.max_payload
            if len(reply) > limit:
                too_large = {
                    "error": f"the answer ({len(reply)} bytes) is larger than NATS carries "
                    f"({limit} bytes: the servers' max_payload)",
                    "status": 502,
                }
                reply = json.dumps(too_large).encode() + b"\n"
            with contextlib.suppress(Exception):
                await msg.respond(reply)

        self._reads = await self.store.client.subscribe(
            self._read_subject(self.node.node_id), cb=handle
        )

    async def ask(
        self, node_id: str, op: str, args: dict[str, Any], timeout: float = 3.0
    ) -> Answer:
        """Ask `node_id` for a read; an `Answer` with status 503 when it does not answer
        within `timeout` (gone, or too busy)."""
        request = json.dumps({"op": op, "args": args}).encode()
        try:
            reply = await self.store.client.request(
                self._read_subject(node_id), request, timeout=timeout
            )
        except Exception as exc:  # no responders, timeout, disconnected
            why = str(exc) or type(exc).__name__
            return Answer({"error": f"node {node_id} does not answer ({why})", "status": 503})
        data = bytes(reply.data)
        line, _, body = data.partition(b"\n")
        try:
            head = json.loads(line)
        except ValueError:
            head = None
        if not isinstance(head, dict):
            return Answer({"error": f"node {node_id} answered what is not a reply", "status": 502})
        return Answer(head, body)

    def info(self) -> FleetInfo:
        """What this node knows of the fleet; read it on the event loop."""
        view = self.node.view
        owned: dict[str, list[str]] = {}
        for stream_id, (node_id, _) in view.owners.items():
            owned.setdefault(node_id, []).append(stream_id)
        nodes = view.live_nodes(self.store.node_ttl_s)
        nodes.setdefault(self.node.node_id, self.node.state())
        for node_id in owned:  # a lease outliving its node's registry entry
            nodes.setdefault(node_id, NodeState(node_id, 0))
        return FleetInfo(
            node_id=self.node.node_id,
            nodes=tuple(
                NodeInfo(n.node_id, n.capacity, n.draining, tuple(sorted(owned.get(n.node_id, []))))
                for n in sorted(nodes.values(), key=lambda n: n.node_id)
            ),
            unowned=tuple(sorted(set(view.desired) - set(view.owners))),
            synced=view.synced,
        )

    async def leave(self, handoff: bool = True) -> None:
        """Hand the streams off (or, without `handoff`, just stop), stop the feed, disconnect."""
        try:
            if self._reads is not None:
                with contextlib.suppress(Exception):
                    await self._reads.unsubscribe()
            await self.node.stop(handoff=handoff)
            if self._task is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(self._task, 10.0)
            await self.feed.stop()
        finally:
            with contextlib.suppress(Exception):
                await self.store.close()


async def _seed(
    store: FleetStore, prefix: str, replicas: int, configured: Iterable[StreamSpec]
) -> None:
    specs = list(configured)
    if not specs:
        return
    js = store.js
    config = KeyValueConfig(bucket=f"{prefix}_seeded", history=1, replicas=replicas)
    try:
        seeded = await js.key_value(config.bucket)
    except Exception:
        seeded = await js.create_key_value(config)
    for spec in specs:
        digest = seed_hash(spec)
        try:
            entry = await seeded.get(spec.id)
            if entry.value == digest:
                continue  # seeded before: what the API made of it stands
        except (KeyNotFoundError, KeyDeletedError):
            pass
        await store.put_spec(spec.id, spec.model_dump(mode="json", exclude={"id"}))
        await seeded.put(spec.id, digest)
        log.info("fleet: configured source %s written to the desired state", spec.id)


__all__ = [
    "Answer",
    "FleetInfo",
    "FleetMember",
    "NodeInfo",
    "ReadAnswer",
    "connect_options",
    "options_of",
]
