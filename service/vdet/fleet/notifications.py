"""Zone and line events notified once per fleet: one durable JetStream consumer on the results
stream, shared by every node that has webhooks or MQTT configured.

The consumer (`<prefix>_results`, durable name `notify`, explicit acknowledgements) hands each
result to exactly one of the nodes fetching from it; that node's notifier sends the result's
events (vdet.notify) and acknowledges it. A node that dies with results fetched and not
acknowledged leaves them to be delivered again to another node after `ack_wait_s`, so a
crash loses no event; an event whose result was acknowledged and whose webhook delivery was
still queued on the dead node is lost with it (the notifier's queues are in memory). Created
by the first node with `notify` settings as it joins, before it starts any stream, it starts
with the results published from then on.

Every node should carry the same `notify` settings: the consumer splits the fleet's results
between the nodes that fetch, whatever each would do with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from nats.errors import ConnectionClosedError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from vdet.fleet.feed import parse_payload
from vdet.fleet.keys import key_problem
from vdet.fleet.results_bus import stream_name
from vdet.results.hub import EncodedResult

log = logging.getLogger(__name__)

DURABLE = "notify"
_MAX_ACK_PENDING = 4096


async def ensure_consumer(js: JetStreamContext, prefix: str, ack_wait_s: float = 30.0) -> None:
    """Make the shared consumer when the fleet has none yet: before this node starts any
    stream (FleetMember.join), so that no result of its streams comes before it."""
    name = stream_name(prefix)
    try:
        await js.consumer_info(name, DURABLE)
    except NotFoundError:
        with contextlib.suppress(Exception):  # another node made it meanwhile
            await js.add_consumer(
                name,
                ConsumerConfig(
                    durable_name=DURABLE,
                    deliver_policy=DeliverPolicy.NEW,
                    ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=ack_wait_s,
                    max_ack_pending=_MAX_ACK_PENDING,
                ),
            )


async def follow_notifications(
    js: JetStreamContext,
    prefix: str,
    dispatch: Callable[[EncodedResult], object],
    *,
    batch: int = 256,
    on_pending: Callable[[int], object] | None = None,
) -> None:
    """Hand every result this node gets from the shared consumer to `dispatch`, then
    acknowledge it; runs until cancelled or the connection is closed. `dispatch` must not
    block (the notifier queues). `on_pending(n)`: after each fetch, the results the consumer
    has not handed to any node yet (the fleet's notification backlog)."""
    name = stream_name(prefix)
    skip = len(f"{prefix}.results.")
    await ensure_consumer(js, prefix)
    subscription = await js.pull_subscribe_bind(DURABLE, stream=name)
    try:
        while True:
            try:
                messages = await subscription.fetch(batch, timeout=1.0)
            except NatsTimeoutError:
                if on_pending is not None:
                    on_pending(0)  # nothing came in a second: nothing waits
                continue
            except ConnectionClosedError:
                return  # the node left the fleet
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a server gone: the client reconnects; fetch again
                log.warning("fleet: fetching results to notify failed: %s", exc)
                await asyncio.sleep(0.5)
                continue
            if on_pending is not None and messages:
                on_pending(int(messages[-1].metadata.num_pending or 0))
            for message in messages:
                stream_id = message.subject[skip:]
                parsed = parse_payload(bytes(message.data))
                if parsed is not None and key_problem(stream_id) is None:
                    seq = int(message.metadata.sequence.stream)
                    try:
                        dispatch(EncodedResult(seq, stream_id, parsed[0], parsed[1]))
                    except Exception:
                        log.exception("fleet: notifying result %d failed", seq)
                with contextlib.suppress(Exception):
                    await message.ack()
    finally:
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()


__all__ = ["DURABLE", "ensure_consumer", "follow_notifications"]
