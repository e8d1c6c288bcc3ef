"""`Inbox`: one thread reads many worker pipes; order per pipe, EOF per pipe, fairness; and
`MessageSplitter`, which splits what it reads into the messages `Connection.send` wrote."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from vdet.workers.channel import Channel
from vdet.workers.inbox import Inbox


@pytest.fixture
def inbox() -> object:
    box = Inbox(name="test-inbox")
    yield box
    box.close()


def _pipe() -> tuple[Channel, Channel]:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    return Channel(ours), Channel(theirs)


def _wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


def test_messages_of_each_pipe_arrive_in_order_on_one_thread(inbox: Inbox) -> None:
    received: dict[int, list[int]] = {0: [], 1: [], 2: []}
    threads: set[str] = set()
    senders = []
    for key in received:
        ours, theirs = _pipe()
        senders.append(theirs)

        def on_message(message: object, key: int = key) -> None:
            threads.add(threading.current_thread().name)
            received[key].append(message)  # type: ignore[arg-type]

        inbox.add(ours, on_message, lambda: None)
    for n in range(500):
        for sender in senders:
            sender.send(n)
    _wait_for(lambda: all(len(v) == 500 for v in received.values()))
    assert all(v == list(range(500)) for v in received.values())
    assert threads == {"test-inbox"}


def test_a_closed_pipe_is_reported_once_and_the_others_go_on(inbox: Inbox) -> None:
    closed: list[str] = []
    got: list[object] = []
    a, a_far = _pipe()
    b, b_far = _pipe()
    inbox.add(a, got.append, lambda: closed.append("a"))
    inbox.add(b, got.append, lambda: closed.append("b"))
    a_far.send("last of a")
    a_far.close()
    _wait_for(lambda: closed == ["a"])
    b_far.send("b goes on")
    _wait_for(lambda: "b goes on" in got)
    assert got == ["last of a", "b goes on"]
    time.sleep(0.05)
    assert closed == ["a"]


def test_a_failing_handler_does_not_stop_the_pipe(inbox: Inbox) -> None:
    got: list[object] = []

    def on_message(message: object) -> None:
        if message == "bad":
            raise ValueError("bad message")
        got.append(message)

    ours, theirs = _pipe()
    inbox.add(ours, on_message, lambda: None)
    for message in ("one", "bad", "two"):
        theirs.send(message)
    _wait_for(lambda: got == ["one", "two"])


def test_a_busy_pipe_does_not_starve_a_quiet_one(inbox: Inbox) -> None:
    busy_count = 0
    seen_busy_when_quiet_arrived: list[int] = []
    busy, busy_far = _pipe()
    quiet, quiet_far = _pipe()

    def on_busy(message: object) -> None:
        nonlocal busy_count
        busy_count += 1
        time.sleep(0.0005)

    inbox.add(busy, on_busy, lambda: None)
    inbox.add(quiet, lambda m: seen_busy_when_quiet_arrived.append(busy_count), lambda: None)
    payload = b"x" * 4096  # the inbox reads 256 KiB of a pipe at a time: 64 of these
    feeder = threading.Thread(target=lambda: [busy_far.send(payload) for _ in range(2000)])
    feeder.start()  # a backlog: 2000 messages at 0.5 ms each is a second of reading
    _wait_for(lambda: busy_count > 100)
    sent_at = busy_count
    quiet_far.send("hello")
    _wait_for(lambda: bool(seen_busy_when_quiet_arrived))
    # The quiet pipe waited for at most a couple of reads of the busy one, not its backlog.
    assert seen_busy_when_quiet_arrived[0] - sent_at <= 3 * 64
    _wait_for(lambda: busy_count == 2000)
    feeder.join()


def test_add_after_close_is_refused() -> None:
    box = Inbox()
    box.close()
    box.close()  # idempotent
    ours, _theirs = _pipe()
    with pytest.raises(RuntimeError, match="closed"):
        box.add(ours, lambda m: None, lambda: None)


@pytest.mark.parametrize("chunk", [1, 3, 4096, 1 << 20])
def test_the_splitter_rebuilds_what_send_wrote_however_it_is_read(chunk: int) -> None:
    import os
    import random

    from vdet.workers.channel import MessageSplitter

    rng = random.Random(chunk)
    # Around the sizes where send_bytes changes how it writes (one write up to 16384 bytes,
    # header and body apart above), and empty bodies.
    messages: list[object] = [b"", b"a", b"x" * 16379, b"y" * 16384, b"z" * 70_000, ("t", 1)]
    messages += [bytes(rng.randrange(256) for _ in range(rng.randrange(300))) for _ in range(50)]
    ours, theirs = multiprocessing.Pipe(duplex=True)
    feeder = threading.Thread(target=lambda: [theirs.send(m) for m in messages])
    feeder.start()
    splitter = MessageSplitter()
    got: list[object] = []
    while len(got) < len(messages):
        got += splitter.feed(os.read(ours.fileno(), chunk))
    feeder.join()
    assert got == messages
    assert splitter.pending == 0


def test_on_an_event_loop_the_pipes_are_read_by_the_loop_thread() -> None:
    import asyncio

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, name="test-loop", daemon=True)
    runner.start()
    box = Inbox(loop)
    try:
        assert box.on_loop
        got: list[tuple[str, object]] = []
        closed: list[str] = []
        ours, theirs = _pipe()
        other, other_far = _pipe()
        box.add(ours, lambda m: got.append((threading.current_thread().name, m)), lambda: None)
        box.add(other, lambda m: None, lambda: closed.append("other"))
        for n in range(300):
            theirs.send(n)
        _wait_for(lambda: len(got) == 300)
        assert [m for _, m in got] == list(range(300))
        assert {name for name, _ in got} == {"test-loop"}
        other_far.close()
        _wait_for(lambda: closed == ["other"])
        box.close()
        theirs.send("after close")
        time.sleep(0.1)
        assert len(got) == 300  # no longer read
    finally:
        box.close()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()
