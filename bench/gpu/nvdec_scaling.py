"""Why does NVDEC decode not scale across sessions in vdet's reader? A probe of the suspects.

Run on the GPU machine: python3 bench/gpu/nvdec_scaling.py --out nvdec_scaling.json

N threads each decode the sample clip in a loop for a few seconds with `NvdecDecoder`
(vdet.ingest.nvdec), fed either by PyAV (as `NvdecSourceReader` does) or by PyNvVideoCodec's
own demuxer, in LOW latency (ENDOFPICTURE, each frame from its own packet: vdet's choice for
streams without B-frames) or NATIVE latency. Aggregate frames/s per configuration, process CPU,
and whether `Decode` holds the GIL (a counting thread's rate while one thread decodes).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

from vdet.bench.environment import environment

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "service" / "vdet" / "assets" / "sample.mp4"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _packets_pyav() -> list[tuple[bytes, int, bool]]:
    import av
    import av.bitstream

    out = []
    with av.open(str(SAMPLE)) as container:
        stream = container.streams.video[0]
        bsf = av.bitstream.BitStreamFilterContext("h264_mp4toannexb", stream)
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            for unit in bsf.filter(packet):
                out.append((bytes(unit), int(unit.pts or 0), bool(unit.is_keyframe)))
    return out


def _run(threads: int, latency: str, seconds: float, packets: list[Any]) -> dict[str, Any]:
    from vdet.ingest.nvdec import NvdecDecoder

    counts = [0] * threads
    stop = threading.Event()
    errors: list[str] = []

    def work(i: int) -> None:
        try:
            decoder = NvdecDecoder("h264", b_frames=latency == "native")
            while not stop.is_set():
                for data, pts, key in packets:
                    if stop.is_set():
                        break
                    counts[i] += len(decoder.decode(data, pts, key))
                counts[i] += len(decoder.flush())
            decoder.close()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    time.sleep(1.0)  # sessions created, warm
    c0, n0, w0 = _cpu(), sum(counts), time.monotonic()
    time.sleep(seconds)
    wall, frames, cpu = time.monotonic() - w0, sum(counts) - n0, _cpu() - c0
    stop.set()
    for t in pool:
        t.join(10)
    return {
        "threads": threads,
        "latency": latency,
        "fps": frames / wall,
        "cpu_percent": 100 * cpu / wall,
        "errors": errors[:3],
    }


def _gil_probe(packets: list[Any]) -> dict[str, float]:
    """Counter rate alone, then while a thread decodes: a large drop means Decode holds the GIL."""
    from vdet.ingest.nvdec import NvdecDecoder

    def count(seconds: float) -> float:
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        return n / seconds

    alone = count(1.0)
    stop = threading.Event()

    def decode() -> None:
        decoder = NvdecDecoder("h264")
        while not stop.is_set():
            for data, pts, key in packets:
                if stop.is_set():
                    break
                decoder.decode(data, pts, key)
            decoder.flush()

    t = threading.Thread(target=decode, daemon=True)
    t.start()
    time.sleep(0.3)
    busy = count(1.0)
    stop.set()
    t.join(10)
    return {"counter_rate_alone": alone, "counter_rate_while_decoding": busy, "ratio": busy / alone}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("nvdec_scaling.json"))
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--threads", default="1,8,32")
    args = parser.parse_args()
    packets = _packets_pyav()
    report: dict[str, Any] = {
        "environment": environment(),
        "clip": str(SAMPLE.name),
        "packets": len(packets),
        "runs": [],
    }
    report["gil"] = _gil_probe(packets)
    print("gil", report["gil"], flush=True)
    for latency in ("low", "native"):
        for n in [int(x) for x in args.threads.split(",")]:
            run = _run(n, latency, args.seconds, packets)
            report["runs"].append(run)
            print(run, flush=True)
            args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
