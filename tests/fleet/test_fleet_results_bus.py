"""Results on the fleet's JetStream stream (vdet.fleet.results_bus), on a real NATS server:
one sequence for the whole fleet, resume anywhere without gap or duplicate, retention gaps
said, and no result published without the stream's lease."""

from __future__ import annotations

import asyncio
import time

import nats
from nats.errors import TimeoutError as NatsTimeoutError
from support.nats_servers import NatsServer

from vdet.fleet.node import FleetNode
from vdet.fleet.results_bus import (
    BusGap,
    BusResult,
    ResultsPublisher,
    ResultsReader,
    ResultsRetention,
    open_results,
)
from vdet.fleet.store import FleetOptions, FleetStore


async def _read_all(reader: ResultsReader) -> list[BusResult | BusGap]:
    items: list[BusResult | BusGap] = []
    while True:
        try:
            items.append(await reader.next(timeout=0.5))
        except NatsTimeoutError:
            return items


def test_one_sequence_for_the_fleet_and_resume_anywhere(server: NatsServer) -> None:
    async def run() -> None:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await open_results(js, "vdet", ResultsRetention())
        node_a = ResultsPublisher(js, "vdet", holds=lambda s: True)
        node_b = ResultsPublisher(js, "vdet", holds=lambda s: True)
        seqs = []
        for i in range(30):
            publisher, stream = (node_a, "cam1") if i % 3 else (node_b, "cam2")
            seqs.append(await publisher.publish(stream, f"result {i}".encode()))
        assert seqs == list(range(1, 31))
        everything = await _read_all(await ResultsReader.open(js, "vdet", after=0))
        assert [r.seq for r in everything if isinstance(r, BusResult)] == seqs
        # Resume after 17 on "another node" (another connection): no gap, no duplicate.
        other = await nats.connect(server.url)
        rest = await _read_all(await ResultsReader.open(other.jetstream(), "vdet", after=17))
        assert [r.seq for r in rest if isinstance(r, BusResult)] == list(range(18, 31))
        one = await _read_all(await ResultsReader.open(js, "vdet", after=0, stream_id="cam2"))
        assert [r.payload for r in one if isinstance(r, BusResult)] == [
            f"result {i}".encode() for i in range(0, 30, 3)
        ]
        await other.close()
        await nc.close()

    asyncio.run(run())


def test_a_long_backlog_is_replayed_whole_and_in_order(server: NatsServer) -> None:
    """20,000 results of 800 bytes published before the reader starts: it reads every one,
    in order, none dropped (the reader's bound is in bytes, with the servers' flow control)."""

    async def run() -> None:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await open_results(js, "vdet", ResultsRetention())
        for i in range(20_000):
            await js.publish(f"vdet.results.cam{i % 7}", b"%05d" % i + b"x" * 795)
        reader = await ResultsReader.open(js, "vdet", after=0)
        seqs = [item.seq for item in await _read_all(reader) if isinstance(item, BusResult)]
        assert seqs == list(range(1, 20_001))
        await reader.close()
        await nc.close()

    asyncio.run(run())


def test_publishing_without_waiting_keeps_order_and_counts_acks(server: NatsServer) -> None:
    async def run() -> None:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await open_results(js, "vdet", ResultsRetention())
        held = {"cam1"}
        acks: list[float] = []
        publisher = ResultsPublisher(js, "vdet", holds=lambda s: s in held, on_ack=acks.append)
        for i in range(500):
            assert await publisher.publish_nowait("cam1", b"%d" % i)
        assert not await publisher.publish_nowait("cam9", b"not ours")
        await publisher.flush()
        assert (publisher.failed, publisher.fenced) == (0, 1)
        # Each acknowledged result's latency, from its hand-off: one each, none negative.
        assert len(acks) == 500 and min(acks) >= 0 and max(acks) < 10
        items = await _read_all(await ResultsReader.open(js, "vdet", after=0))
        results = [i for i in items if isinstance(i, BusResult)]
        assert [i.payload for i in results] == [b"%d" % i for i in range(500)]
        # What the reader still had to read after each: the last one, nothing.
        assert results[0].pending == 499 and results[-1].pending == 0
        await nc.close()

    asyncio.run(run())


def test_results_gone_with_retention_are_a_gap(server: NatsServer) -> None:
    async def run() -> None:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await open_results(js, "short", ResultsRetention(max_age_s=1.0))
        publisher = ResultsPublisher(js, "short", holds=lambda s: True)
        for i in range(5):
            await publisher.publish("cam1", b"old %d" % i)
        await asyncio.sleep(2.0)  # the five age out
        await publisher.publish("cam1", b"new")
        items = await _read_all(await ResultsReader.open(js, "short", after=2))
        assert items[0] == BusGap(missing=3, first=6)
        assert [i.payload for i in items[1:] if isinstance(i, BusResult)] == [b"new"]
        await nc.close()

    asyncio.run(run())


def test_nothing_is_published_without_the_lease(server: NatsServer) -> None:
    """A node publishes for a stream only while it holds its lease and renewed it within
    three quarters of the lease period (a paused node comes back fenced)."""

    async def run() -> None:
        options = FleetOptions((server.url,), "a", capacity=2, lease_s=1.0, node_ttl_s=1.0)
        store = await FleetStore.open(options)
        js = store.client.jetstream()
        await open_results(js, "vdet", ResultsRetention())
        node = FleetNode(options, store, _NoStreams())
        publisher = ResultsPublisher(js, "vdet", holds=node.holds)
        assert await publisher.publish("cam1", b"x") is None  # not claimed
        await node.view.start()
        await store.put_spec("cam1", {"id": "cam1", "url": "rtsp://127.0.0.1:8554/c"})
        deadline = time.monotonic() + 5
        while "cam1" not in node.held and time.monotonic() < deadline:
            await node.tick()
            await asyncio.sleep(0.05)
        assert await publisher.publish("cam1", b"mine") == 1
        await asyncio.sleep(0.8)  # no renewal for 0.8 s of a 1 s lease: fenced
        assert not node.holds("cam1")
        assert await publisher.publish("cam1", b"stale") is None
        assert publisher.fenced == 2
        await node.view.stop()
        await store.close()

    asyncio.run(run())


class _NoStreams:
    """A `StreamControl` that runs nothing (these tests are about the bus)."""

    def add(self, spec: object) -> None:
        return None

    def change(self, stream_id: str, changes: object) -> None:
        return None

    def remove(self, stream_id: str) -> None:
        return None
