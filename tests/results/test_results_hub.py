"""ResultsHub: numbering, replay buffers, gaps, and fan-out to event-loop subscribers."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import threading

import pytest

from vdet.core.types import DetectionResult, Detections, StageTimings
from vdet.results.hub import (
    EncodedResult,
    ResultsHub,
    SubscriptionEnd,
    SubscriptionEndedError,
    _Outbox,
)


def result(source: str = "a", index: int = 0) -> DetectionResult:
    return DetectionResult(
        source_id=source,
        frame_index=index,
        pts_seconds=None,
        arrival_time=0.0,
        published_time=0.0,
        image_size_wh=(4, 4),
        detections=Detections.empty(),
        timings=StageTimings(),
    )


def test_publish_numbers_results_and_keeps_latest_per_source() -> None:
    hub = ResultsHub()
    assert hub.last_seq == 0
    assert hub.oldest_seq is None
    assert hub.latest_encoded("a") is None
    first = hub.publish(result("a", 0))
    second = hub.publish(result("b", 0))
    third = hub.publish(result("a", 1))
    assert [first.seq, second.seq, third.seq] == [1, 2, 3]
    assert hub.latest_encoded("a") == third
    assert hub.latest_encoded("b") == second
    assert hub.last_seq == 3
    assert hub.oldest_seq == 1


def test_since_is_oldest_first_and_filters_by_source() -> None:
    hub = ResultsHub()
    for i in range(6):
        hub.publish(result("ab"[i % 2], i))
    assert [r.seq for r in hub.since(0)] == [1, 2, 3, 4, 5, 6]
    assert [r.seq for r in hub.since(3)] == [4, 5, 6]
    assert [r.seq for r in hub.since(0, "a")] == [1, 3, 5]
    assert [r.seq for r in hub.since(3, "b")] == [4, 6]
    assert hub.since(6) == []
    assert hub.since(0, "unknown") == []


def test_buffers_are_bounded_per_source_and_in_total() -> None:
    hub = ResultsHub(capacity_per_source=2, capacity_total=3)
    for i in range(5):
        hub.publish(result("a", i))
    hub.publish(result("b", 0))
    assert [r.seq for r in hub.since(0)] == [4, 5, 6]
    assert [r.seq for r in hub.since(0, "a")] == [4, 5]
    assert hub.oldest_seq == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity_per_source": 0}, "capacity_per_source"),
        ({"capacity_total": 0}, "capacity_total"),
        ({"subscriber_queue_size": 0}, "subscriber_queue_size"),
    ],
)
def test_rejects_empty_capacities(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ResultsHub(**kwargs)


async def test_remove_source_drops_latest_and_flags_a_gap_for_a_reused_id() -> None:
    hub = ResultsHub()
    hub.publish(result("a"))
    hub.publish(result("b"))
    hub.remove_source("a")
    assert hub.latest_encoded("a") is None
    assert hub.since(0, "a") == []
    assert hub.latest_encoded("b") is not None
    # A new stream with the old id: a client resuming from before the removal is told.
    hub.publish(result("a"))
    assert hub.since(0, "a")[0].seq == 3
    resumed = hub.subscribe("a", after_seq=0)
    assert resumed.replay.gap
    assert [r.seq for r in resumed.replay.results] == [3]
    resumed.close()


async def test_subscribe_replays_then_delivers_live_without_gaps_or_duplicates() -> None:
    hub = ResultsHub()
    for i in range(3):
        hub.publish(result("a", i))
    sub = hub.subscribe("a", after_seq=1)
    assert [r.seq for r in sub.replay.results] == [2, 3]
    assert not sub.replay.gap
    hub.publish(result("b", 0))  # another source: not delivered
    hub.publish(result("a", 3))
    live = await asyncio.wait_for(sub.get(), 1)
    assert live.seq == 5
    sub.close()
    assert hub.subscriber_count == 0


async def test_subscribe_without_after_gets_only_new_results() -> None:
    hub = ResultsHub()
    hub.publish(result())
    sub = hub.subscribe(None)
    assert sub.replay.results == ()
    assert sub.start_seq == 1
    hub.publish(result("b"))
    assert (await asyncio.wait_for(sub.get(), 1)).seq == 2
    sub.close()


async def test_replay_reports_a_gap_when_the_requested_seq_was_evicted() -> None:
    hub = ResultsHub(capacity_per_source=3, capacity_total=4)
    for i in range(10):
        hub.publish(result("a", i))
    everything = hub.subscribe(None, after_seq=2)
    assert everything.replay.gap
    assert everything.replay.oldest_seq == 7
    assert [r.seq for r in everything.replay.results] == [7, 8, 9, 10]
    one = hub.subscribe("a", after_seq=8)
    assert not one.replay.gap
    assert [r.seq for r in one.replay.results] == [9, 10]
    stale = hub.subscribe("a", after_seq=6)
    assert stale.replay.gap
    assert stale.replay.oldest_seq == 8
    for sub in (everything, one, stale):
        sub.close()


async def test_a_seq_from_before_a_restart_is_a_gap_with_full_replay() -> None:
    hub = ResultsHub()
    hub.publish(result())
    sub = hub.subscribe(None, after_seq=1000)
    assert sub.replay.gap
    assert [r.seq for r in sub.replay.results] == [1]
    sub.close()


async def test_publishing_from_threads_reaches_the_loop_in_seq_order() -> None:
    hub = ResultsHub(subscriber_queue_size=1000)
    sub = hub.subscribe(None)

    def publish_many(source: str) -> None:
        for i in range(100):
            hub.publish(result(source, i))

    threads = [threading.Thread(target=publish_many, args=(s,)) for s in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = [(await asyncio.wait_for(sub.get(), 1)).seq for _ in range(300)]
    assert seqs == list(range(1, 301))
    sub.close()


async def test_many_publishing_threads_reach_every_subscriber_in_order_and_filtered() -> None:
    # Several subscribers of one loop share its outbox: each gets all of its results, in seq
    # order, the per-source ones only theirs, whatever the publishing threads interleave.
    hub = ResultsHub(subscriber_queue_size=10_000, capacity_total=10_000)
    everything = [hub.subscribe(None) for _ in range(3)]
    only_b = hub.subscribe("b")

    def publish_many(source: str) -> None:
        for i in range(1000):
            hub.publish(result(source, i))

    threads = [threading.Thread(target=publish_many, args=(s,)) for s in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sub in everything:
        seqs = [(await asyncio.wait_for(sub.get(), 1)).seq for _ in range(4000)]
        assert seqs == list(range(1, 4001))
    got_b = [await asyncio.wait_for(only_b.get(), 1) for _ in range(1000)]
    assert {r.source_id for r in got_b} == {"b"}
    assert [r.frame_index for r in got_b] == list(range(1000))
    for sub in [*everything, only_b]:
        sub.close()
    assert hub.subscriber_count == 0


async def test_a_long_burst_is_delivered_a_batch_per_callback_with_others_between() -> None:
    # Results that piled up while the loop was busy go out `_Outbox.batch` at a time, so a
    # timer or request that became ready meanwhile runs between two batches, not after all.
    hub = ResultsHub(subscriber_queue_size=1000)
    sub = hub.subscribe(None)
    batch = _Outbox.batch
    for i in range(3 * batch):
        hub.publish(result("a", i))
    delivered_before_other: list[int] = []
    asyncio.get_running_loop().call_soon(lambda: delivered_before_other.append(len(sub._items)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert delivered_before_other == [batch]
    seqs = [(await asyncio.wait_for(sub.get(), 1)).seq for _ in range(3 * batch)]
    assert seqs == list(range(1, 3 * batch + 1))
    hub.publish(result("a", 3 * batch))  # a new burst after the last one drained
    assert (await asyncio.wait_for(sub.get(), 1)).seq == 3 * batch + 1
    sub.close()


async def test_a_result_still_on_its_way_when_subscribing_is_not_delivered_live() -> None:
    hub = ResultsHub()
    first = hub.subscribe(None)
    hub.publish(result("a", 0))  # queued for this loop, not yet delivered
    late = hub.subscribe(None)
    hub.publish(result("a", 1))
    assert (await asyncio.wait_for(first.get(), 1)).seq == 1
    assert (await asyncio.wait_for(first.get(), 1)).seq == 2
    assert (await asyncio.wait_for(late.get(), 1)).seq == 2  # seq 1 came before it subscribed
    first.close()
    late.close()


async def test_a_slow_subscriber_is_cut_off_as_lagging_not_buffered() -> None:
    hub = ResultsHub(subscriber_queue_size=3)
    slow = hub.subscribe(None)
    for i in range(10):
        hub.publish(result("a", i))
    await asyncio.sleep(0)  # let the loop run the deliveries
    with pytest.raises(SubscriptionEndedError) as ended:
        await asyncio.wait_for(slow.get(), 1)
    assert ended.value.reason is SubscriptionEnd.LAGGING
    assert slow.ended is SubscriptionEnd.LAGGING
    assert hub.subscriber_count == 0
    # It resumes from the replay buffer with nothing lost.
    resumed = hub.subscribe(None, after_seq=0)
    assert [r.seq for r in resumed.replay.results] == list(range(1, 11))
    resumed.close()


async def test_remove_source_and_close_end_subscriptions() -> None:
    hub = ResultsHub()
    one = hub.subscribe("a")
    other = hub.subscribe("b")
    everything = hub.subscribe(None)
    hub.remove_source("a")
    with pytest.raises(SubscriptionEndedError) as ended:
        await asyncio.wait_for(one.get(), 1)
    assert ended.value.reason is SubscriptionEnd.SOURCE_REMOVED
    hub.close()
    for sub in (other, everything):
        with pytest.raises(SubscriptionEndedError) as ended:
            await asyncio.wait_for(sub.get(), 1)
        assert ended.value.reason is SubscriptionEnd.CLOSED


async def test_subscription_is_an_async_iterator_that_stops_when_closed() -> None:
    hub = ResultsHub()
    sub = hub.subscribe("a")
    hub.publish(result("a"))
    hub.publish(result("a"))
    seen = []
    async for r in sub:
        seen.append(r.seq)
        if len(seen) == 2:
            sub.close()
    assert seen == [1, 2]


def test_on_publish_runs_on_the_publishing_thread_only_while_someone_subscribes() -> None:
    hub = ResultsHub()
    seen: list[tuple[int, str]] = []
    hub.on_publish(lambda r: seen.append((r.seq, threading.current_thread().name)))
    hub.publish(result("a"))
    assert seen == []  # nobody listens: nothing to prepare

    async def subscribed() -> None:
        sub = hub.subscribe()
        try:
            await asyncio.get_running_loop().run_in_executor(None, hub.publish, result("a"))
        finally:
            sub.close()

    asyncio.run(subscribed())
    assert len(seen) == 1 and seen[0][0] == 2
    assert seen[0][1] != threading.main_thread().name


def test_a_failing_on_publish_loses_no_result() -> None:
    hub = ResultsHub()

    def broken(_: object) -> None:
        raise RuntimeError("boom")

    hub.on_publish(broken)

    async def subscribed() -> int:
        sub = hub.subscribe()
        try:
            numbered = hub.publish(result("a"))
            return (await sub.get()).seq if numbered.seq else -1
        finally:
            sub.close()

    assert asyncio.run(subscribed()) == 1
    assert hub.latest_encoded("a") is not None


async def test_encoded_results_are_kept_compact_and_replayed_with_their_text() -> None:
    hub = ResultsHub(capacity_per_source=8, capacity_total=8)
    live = hub.subscribe()
    encoded = dataclasses.replace(result("a", 7), encoded_tail=',"x":1}}')
    numbered = hub.publish(encoded)
    hub.publish(result("a", 8))  # made in this process: kept whole
    latest = hub.latest_encoded("a")
    assert latest is not None and latest.frame_index == 8
    gc.collect()  # a young collection untracks the kept tuple of an encoded result
    assert not gc.is_tracked(hub._history[0])
    first, second = hub.since(0)
    assert first == EncodedResult(numbered.seq, "a", 7, ',"x":1}}')
    assert isinstance(second, DetectionResult) and second.frame_index == 8
    assert hub.find("a", 7) == first
    delivered = [await asyncio.wait_for(live.get(), 1) for _ in range(2)]
    assert delivered == [first, second]
    replayed = hub.subscribe("a", after_seq=0)
    assert list(replayed.replay.results) == [first, second]
    live.close()
    replayed.close()


async def test_encoded_results_share_the_numbering_and_keep_only_their_text() -> None:
    """A worker's result arrives as its wire text (the worker keeps the result itself):
    numbered and fanned out like any other, its text the source's latest."""
    hub = ResultsHub()
    sub = hub.subscribe(None, None)
    hub.publish(result("local", 0))
    for index in range(3):
        seq = hub.publish_encoded("w", index, f'"tail-{index}"}}')
        assert seq == index + 2
    assert hub.latest_seq("w") == 4
    assert hub.latest_encoded("w") == EncodedResult(4, "w", 2, '"tail-2"}')
    local = hub.latest_encoded("local")  # published whole, with no wire text: itself
    assert isinstance(local, DetectionResult) and local.seq == 1
    assert hub.latest_encoded("nobody") is None
    await asyncio.sleep(0)  # the outbox delivers
    got = [await sub.get() for _ in range(4)]
    assert [r.seq for r in got] == [1, 2, 3, 4]
    assert got[1] == EncodedResult(2, "w", 0, '"tail-0"}')
    assert hub.find("w", 1) == EncodedResult(3, "w", 1, '"tail-1"}')
    hub.remove_source("w")
    assert hub.latest_seq("w") is None and hub.latest_encoded("w") is None
    sub.close()


def test_observers_see_every_result_without_subscribers_and_cannot_stop_publishing() -> None:
    hub = ResultsHub()
    seen: list[tuple[int, str]] = []

    def failing(_: object) -> None:
        raise RuntimeError("an observer's bug")

    hub.add_observer(failing)
    hub.add_observer(lambda r: seen.append((r.seq, type(r).__name__)))
    hub.publish(result("a", 0))
    seq = hub.publish_encoded("b", 0, ',"source_id":"b"}}')
    assert seen == [(1, "DetectionResult"), (seq, "EncodedResult")]
    assert hub.subscriber_count == 0 and hub.last_seq == 2


def test_with_an_outlet_results_leave_unnumbered_and_return_numbered_from_elsewhere() -> None:
    """A fleet node: what it publishes goes to the outlet; the bus's numbers come back."""
    hub = ResultsHub()
    sent: list[tuple[str, int, object]] = []
    hub.send_to(lambda source, index, what: sent.append((source, index, what)))
    made = hub.publish(result("a", 3))
    assert made.seq == 0 and hub.last_seq == 0 and hub.latest_seq("a") is None
    assert hub.publish_encoded("b", 4, ',"x":1}}') == 0
    assert [(s, i) for s, i, _ in sent] == [("a", 3), ("b", 4)]
    assert isinstance(sent[0][2], DetectionResult) and sent[1][2] == ',"x":1}}'
    # Numbered by the bus (gaps in the numbers are other streams' results elsewhere).
    assert hub.publish_numbered(7, "a", 3, ',"y":1}}')
    assert hub.publish_numbered(9, "b", 4, ',"z":1}}')
    assert not hub.publish_numbered(9, "b", 4, ',"z":1}}'), "a replay is not kept twice"
    assert not hub.publish_numbered(8, "a", 5, ',"w":1}}')
    assert hub.last_seq == 9 and hub.latest_seq("a") == 7
    assert [(r.seq, r.source_id) for r in hub.since(0)] == [(7, "a"), (9, "b")]
    # A stream stopped here may run on another node: only the fleet forgets it.
    hub.remove_source("a")
    assert hub.latest_seq("a") == 7
    hub.forget_source("a")
    assert hub.latest_seq("a") is None
    hub.send_to(None)
    assert hub.publish(result("c", 0)).seq == 10
