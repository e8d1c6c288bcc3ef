"""Which waits for the GPU burn CPU? CPU time against wall time per call, single thread.

Run on the GPU machine: python3 bench/gpu/wait_probe.py --out wait_probe.json

For each host wait mode (GpuTuning.host_wait: the primary context's scheduling flag,
vdet.cuda.host_wait):
- `event`: a ~1 ms GPU sleep kernel, then a torch event's `synchronize()`, with a default
  event and with a blocking-sync event;
- `nvdec`: `NvdecDecoder.decode` of the sample clip's packets (PyNvVideoCodec's `Decode`
  waits for each frame in LOW latency mode);
- `runner`: `CudaGraphRunner.run_frame` of decoded frames (demo model, vdet's kernels).
A CPU/wall ratio near 1 means the thread spun through the wait; near 0, that it slept.

`--sections gil` asks the other question of a many-stream process: does a call hold the GIL
while it waits? A second Python thread counts in a loop, alone and then while the main thread
makes the calls; the share of its solo rate it keeps is the share of the GIL the calls leave
to the other threads of the process (controls: a sleep keeps ~1, a pure-Python loop ~0.5).
Its wall times per call include waiting for the GIL against the counter (Python's default
5 ms switch interval here), so they are not the calls' own latency.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

# Beside this script, so on the path when it runs as `python3 bench/gpu/wait_probe.py`.
from accuracy import demo_runner
from nvdec_scaling import _packets_pyav

from vdet.bench.environment import environment
from vdet.cuda.host_wait import set_host_wait
from vdet.inference.postprocess import PostprocessParams
from vdet.ingest.nvdec import NvdecDecoder, decode_file

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "service" / "vdet" / "assets" / "sample.mp4"


def _measure(call: Any, n: int) -> dict[str, float]:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(n):
        call(i)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "cpu_us_per_call": 1e6 * cpu / n,
        "wall_us_per_call": 1e6 * wall / n,
        "cpu_over_wall": cpu / wall,
    }


def _gil_left(call: Any, n: int) -> dict[str, float]:
    """The counting thread's rate while `call` runs n times, as a share of its solo rate."""
    count = 0
    stop = threading.Event()

    def counter() -> None:
        nonlocal count
        while not stop.is_set():
            count += 1

    thread = threading.Thread(target=counter, daemon=True)
    thread.start()
    time.sleep(0.5)
    c0, t0 = count, time.perf_counter()
    time.sleep(0.5)
    solo = (count - c0) / (time.perf_counter() - t0)
    c0, t0 = count, time.perf_counter()
    for i in range(n):
        call(i)
    wall = time.perf_counter() - t0
    during = (count - c0) / wall
    stop.set()
    thread.join()
    return {"gil_left_share": during / solo, "wall_us_per_call": 1e6 * wall / n}


def _gil_section(frames: list[Any], packets: list[Any]) -> dict[str, Any]:
    set_host_wait(0, "block")
    runner, _ = demo_runner(blocking_wait=True)  # as `vdet serve` runs a stream's frames
    params = PostprocessParams()
    runner.run_frame(frames[0], params)  # capture
    decoder = NvdecDecoder("h264")

    def decode(i: int) -> None:
        data, pts, key = packets[i % len(packets)]
        if i and i % len(packets) == 0:
            decoder.flush()
        decoder.decode(data, pts, key)

    def python_loop(_: int) -> None:
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass

    row = {
        "control_sleep_2ms": _gil_left(lambda _: time.sleep(0.002), 200),
        "control_python_loop_2ms": _gil_left(python_loop, 200),
        "nvdec_decode": _gil_left(decode, 290),
        "runner_frame": _gil_left(lambda i: runner.run_frame(frames[i % 100], params), 300),
    }
    decoder.close()
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("wait_probe.json"))
    parser.add_argument("--sections", default="waits,gil", help="waits, gil or both")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    torch.cuda.init()  # type: ignore[no-untyped-call]
    packets = _packets_pyav()
    frames = list(decode_file(str(SAMPLE)))[:100]
    params = PostprocessParams()
    report: dict[str, Any] = {"environment": environment(), "modes": {}}
    if "gil" in sections:
        report["gil"] = _gil_section(frames, packets)
        for what, m in report["gil"].items():
            print(
                f"gil   {what:<24} left to other threads {m['gil_left_share']:.2f}  "
                f"wall {m['wall_us_per_call']:8.0f} us",
                flush=True,
            )
    if "waits" in sections:
        runner, _ = demo_runner()
        runner.run_frame(frames[0], params)  # capture
    for mode in ("spin", "block", "auto") if "waits" in sections else ():
        set_host_wait(0, mode)
        row: dict[str, Any] = {}
        for blocking in (False, True):
            event = torch.cuda.Event(blocking=blocking)  # type: ignore[no-untyped-call]

            def sleep_and_wait(_: int, event: Any = event) -> None:
                torch.cuda._sleep(2_000_000)  # type: ignore[no-untyped-call]  # ~1 ms at ~2 GHz
                event.record()
                event.synchronize()

            row[f"event_blocking_{blocking}"] = _measure(sleep_and_wait, 200)
        decoder = NvdecDecoder("h264")

        def decode(i: int, decoder: NvdecDecoder = decoder) -> None:
            data, pts, key = packets[i % len(packets)]
            if i and i % len(packets) == 0:
                decoder.flush()
            decoder.decode(data, pts, key)

        row["nvdec_decode"] = _measure(decode, 290)
        decoder.close()
        row["runner_frame"] = _measure(lambda i: runner.run_frame(frames[i % 100], params), 300)
        report["modes"][mode] = row
        print(mode, json.dumps(row), flush=True)
    args.out.write_text(json.dumps(report, indent=1))
    for mode, row in report["modes"].items():
        for what, m in row.items():
            print(
                f"{mode:<6}{what:<22} cpu {m['cpu_us_per_call']:8.0f} us  "
                f"wall {m['wall_us_per_call']:8.0f} us  cpu/wall {m['cpu_over_wall']:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
