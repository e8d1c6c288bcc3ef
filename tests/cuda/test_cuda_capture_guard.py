"""CUDA-graph capture kept apart from per-frame CUDA work (vdet.cuda.capture_guard), on the CPU."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from support.waiting import wait_until

from vdet.cuda.capture_guard import CUDA_WORK, CaptureGuard


def _in_thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_capture_waits_for_work_in_flight_and_holds_new_work_back() -> None:
    guard = CaptureGuard()
    events: list[str] = []
    release_work = threading.Event()

    def work() -> None:
        with guard.work():
            events.append("work start")
            release_work.wait(5)
            events.append("work end")

    def capture() -> None:
        with guard.capture():
            events.append("capture")
            time.sleep(0.05)
            events.append("capture end")

    def late_work() -> None:
        with guard.work():
            events.append("late work")

    first = _in_thread(work)
    wait_until(lambda: guard.busy == (1, False), 5, what="work in flight")
    capturing = _in_thread(capture)
    time.sleep(0.05)
    late = _in_thread(late_work)  # arrives while the capture waits: must go after it
    time.sleep(0.05)
    assert events == ["work start"]
    release_work.set()
    for thread in (first, capturing, late):
        thread.join(5)
    assert events == ["work start", "work end", "capture", "capture end", "late work"]
    assert guard.busy == (0, False)


def test_work_runs_side_by_side_and_a_failed_capture_releases_the_guard() -> None:
    guard = CaptureGuard()
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with guard.work():
            inside.set()
            leave.wait(5)

    with guard.work():
        other = _in_thread(hold)
        inside.wait(5)
        assert guard.busy == (2, False)
        leave.set()
        other.join(5)
    with pytest.raises(RuntimeError), guard.capture():
        raise RuntimeError("capture invalidated")
    assert guard.busy == (0, False)
    with guard.work():
        assert guard.busy == (1, False)


def test_the_graph_runner_captures_alone() -> None:
    torch = pytest.importorskip("torch")
    from vdet.core.types import ColourMatrix, ColourRange
    from vdet.gpu.frame_ops import Nv12Geometry
    from vdet.gpu.graphs import CudaGraphRunner, RunnerOptions
    from vdet.inference.postprocess import PostprocessParams

    seen: list[tuple[int, bool]] = []

    class _Graph:
        def __init__(self, work: Callable[[], None]) -> None:
            self.work = work

        def replay(self) -> None:
            self.work()

    def capture(work: Callable[[], None], stream: object) -> _Graph:
        seen.append(CUDA_WORK.busy)
        work()
        return _Graph(work)

    def network(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros((x.shape[0], 6, 4))

    runner = CudaGraphRunner(
        network, input_hw=(32, 32), options=RunnerOptions(device="cpu", capture=capture)
    )
    geometry = Nv12Geometry.of((64, 48), (32, 32), ColourMatrix.BT601, ColourRange.LIMITED)
    nv12 = torch.zeros((72, 64), dtype=torch.uint8)
    result = runner.run(nv12, geometry, PostprocessParams())
    assert result.replayed and seen == [(0, True)]
    assert CUDA_WORK.busy == (0, False)


def test_work_nests_and_a_capture_waits_for_every_thread_seen_so_far() -> None:
    guard = CaptureGuard()
    with guard.work(), guard.work():  # nested in one thread: one hold
        assert guard.busy == (1, False)
    assert guard.busy == (0, False)
    release = threading.Event()
    started = threading.Event()

    def long_work() -> None:
        with guard.work():
            started.set()
            release.wait(5)

    worker = _in_thread(long_work)
    started.wait(5)
    captured = threading.Event()

    def capture() -> None:
        with guard.capture():
            captured.set()

    capturing = _in_thread(capture)
    time.sleep(0.05)
    assert not captured.is_set()  # the other thread's work is still in flight
    release.set()
    for thread in (worker, capturing):
        thread.join(5)
    assert captured.is_set() and guard.busy == (0, False)


def test_a_thread_first_seen_during_a_capture_waits_for_it() -> None:
    guard = CaptureGuard()
    order: list[str] = []
    inside = threading.Event()
    finish = threading.Event()

    def capture() -> None:
        with guard.capture():
            inside.set()
            finish.wait(5)
            order.append("capture end")

    def newcomer() -> None:
        with guard.work():
            order.append("new work")

    capturing = _in_thread(capture)
    inside.wait(5)
    late = _in_thread(newcomer)
    time.sleep(0.05)
    assert order == []
    finish.set()
    for thread in (capturing, late):
        thread.join(5)
    assert order == ["capture end", "new work"]


def test_work_inside_a_capture_on_the_capturing_thread_does_not_deadlock() -> None:
    guard = CaptureGuard()
    with guard.work():
        pass  # this thread is known to the guard
    with guard.capture(), guard.work():
        assert guard.busy == (0, True)
    assert guard.busy == (0, False)


def test_many_threads_working_and_capturing_end_with_the_guard_free() -> None:
    guard = CaptureGuard()
    active = [0]
    violations: list[str] = []
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            with guard.work():
                active[0] += 1
                time.sleep(0.0005)
                active[0] -= 1

    def capture() -> None:
        for _ in range(20):
            with guard.capture():
                if active[0]:
                    violations.append(f"{active[0]} working during a capture")
                time.sleep(0.001)

    workers = [_in_thread(work) for _ in range(8)]
    capturer = _in_thread(capture)
    capturer.join(20)
    stop.set()
    for thread in workers:
        thread.join(5)
    assert not capturer.is_alive() and violations == []
    assert guard.busy == (0, False)
