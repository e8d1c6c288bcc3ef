"""The fleet's state in NATS JetStream key-value buckets, and the writes that keep it consistent.

Three buckets, named from `FleetOptions.prefix`:
- `<prefix>_streams`: the desired state, one key per stream id, its spec as JSON. Any node
  writes it; nothing expires.
- `<prefix>_owners`: one key per running stream, the owner lease. A node takes a lease with
  `create` (refused while the key exists: compare-and-set on "no key") and keeps it with
  `update(last=revision)` (refused once another revision was written); the bucket's TTL is
  the lease period, so a lease not renewed in time expires on the servers and its key is
  purged (a marker the watchers see), whoever holds it, and another node can `create` it.
- `<prefix>_nodes`: one key per live node, what it says of itself (`NodeState`), with the
  same expiry (the node TTL): a node that stops heartbeating leaves the registry.

The TTLs are the buckets' own, fixed when the first node creates them; a node that finds the
buckets made with other periods uses theirs (`lease_s`, `node_ttl_s` after `open`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import Any

import nats
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import KeyValueConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyValueError,
    KeyWrongLastSequenceError,
    ServiceUnavailableError,
)
from nats.js.errors import NotFoundError as JsNotFoundError
from nats.js.kv import KeyValue

from vdet.fleet.placement import NodeState

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FleetOptions:
    """How a node joins the fleet. `lease_s`: how long a stream's owner may go without
    renewing before another node can take it (the failover bound); `node_ttl_s`: the same for
    the node registry; `replicas`: copies of each bucket on the NATS cluster (3 survives a
    server lost)."""

    servers: tuple[str, ...]
    node_id: str
    capacity: int
    lease_s: float = 6.0
    node_ttl_s: float = 6.0
    replicas: int = 1
    prefix: str = "vdet"
    tick_s: float = 0.25
    connect_timeout_s: float = 5.0


class FleetStore:
    """One node's connection to the fleet's buckets (`open`, then `close`)."""

    def __init__(
        self,
        client: Client,
        streams: KeyValue,
        owners: KeyValue,
        nodes: KeyValue,
        owners_bucket: str = "vdet_owners",
    ) -> None:
        self.client = client
        self.js = client.jetstream()
        self._owners_bucket = owners_bucket
        self.streams = streams
        self.owners = owners
        self.nodes = nodes
        self.lease_s = 0.0
        self.node_ttl_s = 0.0
        # Set when the client reconnected (to another server, say): watchers may have lost
        # their consumers with the old one.
        self.reconnected = asyncio.Event()

    @classmethod
    async def open(cls, options: FleetOptions, connect: dict[str, Any] | None = None) -> FleetStore:
        """Connect (`connect`: nats.connect's credentials and TLS) and open the buckets."""
        reconnected = asyncio.Event()
        errors: list[str] = []

        async def on_reconnect() -> None:
            reconnected.set()

        async def on_error(exc: Exception) -> None:  # the client's default prints a traceback
            errors.append(str(exc) or type(exc).__name__)
            log.warning("fleet: NATS connection: %s", errors[-1])

        # The servers may come up after this node (compose, a rolling start): connecting is
        # retried, for four connect timeouts, then the start fails naming the last error (a
        # refused token or certificate is retried too, and said).
        wait_s = 4 * options.connect_timeout_s
        try:
            client = await asyncio.wait_for(
                nats.connect(
                    list(options.servers),
                    name=f"vdet {options.node_id}",
                    connect_timeout=options.connect_timeout_s,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    reconnected_cb=on_reconnect,
                    error_cb=on_error,
                    **(connect or {}),
                ),
                wait_s,
            )
        except TimeoutError:
            last = errors[-1] if errors else "no answer"
            raise ConnectionError(
                f"no NATS server of {', '.join(options.servers)} accepted this node within "
                f"{wait_s:g} s (last error: {last})"
            ) from None
        js = client.jetstream()
        p, r = options.prefix, options.replicas
        # A NATS cluster answers JetStream calls once it has elected its leaders: a node that
        # starts with it waits (up to four connect timeouts) instead of failing.
        deadline = time.monotonic() + 4 * options.connect_timeout_s
        streams = await _bucket(
            js, KeyValueConfig(bucket=f"{p}_streams", history=5, replicas=r), deadline
        )
        owners = await _bucket(js, _expiring(f"{p}_owners", options.lease_s, r), deadline)
        nodes = await _bucket(js, _expiring(f"{p}_nodes", options.node_ttl_s, r), deadline)
        store = cls(client, streams, owners, nodes, f"{p}_owners")
        store.reconnected = reconnected
        store.lease_s = await _ttl(owners, options.lease_s)
        store.node_ttl_s = await _ttl(nodes, options.node_ttl_s)
        return store

    async def close(self) -> None:
        await self.client.drain()

    # -- desired state -------------------------------------------------------------------

    async def put_spec(self, stream_id: str, spec: dict[str, Any]) -> int:
        return int(await self.streams.put(stream_id, json.dumps(spec).encode()))

    async def create_spec(self, stream_id: str, spec: dict[str, Any]) -> int | None:
        """Add a stream to the desired state: its revision, or None when the id is taken."""
        try:
            return int(await self.streams.create(stream_id, json.dumps(spec).encode()))
        except KeyWrongLastSequenceError:
            return None

    async def get_spec(self, stream_id: str) -> tuple[dict[str, Any], int] | None:
        """A desired stream's spec and revision; None when there is none."""
        try:
            entry = await self.streams.get(stream_id)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        if entry.value is None or entry.revision is None:
            return None
        spec = json.loads(entry.value)
        if not isinstance(spec, dict):
            return None
        return spec, int(entry.revision)

    async def update_spec(self, stream_id: str, spec: dict[str, Any], last: int) -> int | None:
        """Replace a desired stream's spec if it is still at revision `last`: the new
        revision, or None when someone changed it meanwhile."""
        try:
            return int(await self.streams.update(stream_id, json.dumps(spec).encode(), last=last))
        except KeyWrongLastSequenceError:
            return None

    async def delete_spec(self, stream_id: str, last: int | None = None) -> bool:
        """Take a stream out of the desired state (if still at revision `last`, when given);
        False when it changed meanwhile."""
        try:
            await self.streams.delete(stream_id, last=last)
        except KeyWrongLastSequenceError:
            return False
        return True

    # -- owner leases --------------------------------------------------------------------

    async def claim(self, stream_id: str, node_id: str) -> int | None:
        """The lease's revision, or None when another node holds it."""
        try:
            return int(await self.owners.create(stream_id, _owner(node_id)))
        except KeyWrongLastSequenceError:
            pass
        # An expired lease leaves a marker (its TTL is the bucket's) that `create` takes for
        # a live key: take the lease over the marker, compare-and-set on its sequence.
        bucket = self._owners_bucket
        try:
            last = await self.js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{stream_id}")
        except JsNotFoundError:
            return None
        headers = last.headers or {}
        gone = "Nats-Marker-Reason" in headers or headers.get("KV-Operation") in ("DEL", "PURGE")
        if not gone or last.seq is None:
            return None
        try:
            return int(await self.owners.update(stream_id, _owner(node_id), last=last.seq))
        except KeyWrongLastSequenceError:
            return None

    async def renew(self, stream_id: str, node_id: str, revision: int) -> int | None:
        """The lease's new revision, or None when it is no longer this node's (expired and
        taken, or purged)."""
        try:
            return int(await self.owners.update(stream_id, _owner(node_id), last=revision))
        except KeyWrongLastSequenceError:
            return None

    async def release(self, stream_id: str, revision: int) -> bool:
        """Give the lease up now (a hand-off); False when it was not ours any more."""
        try:
            await self.owners.delete(stream_id, last=revision)
        except KeyWrongLastSequenceError:
            return False
        return True

    # -- node registry -------------------------------------------------------------------

    async def heartbeat(self, state: NodeState) -> None:
        await self.nodes.put(state.node_id, json.dumps(dataclasses.asdict(state)).encode())

    async def leave(self, node_id: str) -> None:
        await self.nodes.delete(node_id)


def _owner(node_id: str) -> bytes:
    return json.dumps({"node": node_id, "at": time.time()}).encode()


def owner_of(value: bytes) -> str | None:
    """The node id in an owners-bucket value, or None for a value that is not one."""
    try:
        node = json.loads(value).get("node")
    except (ValueError, AttributeError):
        return None
    return node if isinstance(node, str) else None


def node_state_of(value: bytes) -> NodeState | None:
    """A nodes-bucket value as a `NodeState`, or None for one that does not parse (another
    node's message is input like any other)."""
    try:
        data = json.loads(value)
        state = NodeState(
            node_id=str(data["node_id"]),
            capacity=int(data["capacity"]),
            draining=bool(data.get("draining", False)),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return state if state.capacity >= 0 else None


def _expiring(bucket: str, ttl_s: float, replicas: int) -> KeyValueConfig:
    # limit_marker_ttl: an expired key leaves a purge marker, so watchers see the expiry.
    return KeyValueConfig(
        bucket=bucket,
        history=1,
        ttl=ttl_s,
        replicas=replicas,
        storage=StorageType.FILE,
        limit_marker_ttl=max(1.0, ttl_s),
    )


async def _bucket(js: JetStreamContext, config: KeyValueConfig, deadline: float) -> KeyValue:
    """The bucket, made with `config` when it does not exist yet; JetStream's "not ready"
    answers are retried until `deadline` (monotonic)."""
    while True:
        try:
            try:
                return await js.key_value(config.bucket)
            except (BucketNotFoundError, JsNotFoundError):
                pass
            try:
                return await js.create_key_value(config)
            except KeyValueError:  # another node made it meanwhile
                return await js.key_value(config.bucket)
        except (NatsTimeoutError, ServiceUnavailableError, APIError):
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.5)


async def _ttl(bucket: KeyValue, asked: float) -> float:
    status = await bucket.status()
    ttl = getattr(status, "ttl", None)
    return float(ttl) if ttl else asked


__all__ = ["FleetOptions", "FleetStore", "node_state_of", "owner_of"]
