"""The decode-only ceiling of this machine for a clip, beside `vdet bench serve --find-ceiling`:
the clip looped unpaced in `sessions` readers (the same `select_reader` `vdet serve` uses, so
NVDEC where it takes the clip), spread over processes, for `seconds`; no detection. The
search asks for as many sessions as its largest step has streams, since NVDEC's throughput
grows with the sessions it interleaves.

The figure says how many such cameras this machine could decode at all, so the serve
steps' ceiling reads against it (the serve ceiling over the decode ceiling is the share of
the decoders the whole service keeps busy).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

from vdet.bench.serve.results import DecodeCeiling


def _decode_for(path: str, threads: int, seconds: float, decoder: str) -> tuple[float, str]:
    """In a child process: `threads` readers of `path` for `seconds`; (frames/s, path)."""
    from vdet.ingest.nvdec_reader import select_reader
    from vdet.ingest.reader import DecodeError

    counts = [0] * threads
    paths = ["cpu"] * threads
    gpu_frames = False
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def run(i: int) -> None:
        nonlocal gpu_frames
        reader = select_reader(path, decoder=decoder, loop=True, realtime=False)
        with reader:
            reader.open()
            paths[i] = reader.choice.path
            start.wait()
            for item in reader.frames():
                if stop.is_set():
                    break
                if not isinstance(item, DecodeError):
                    counts[i] += 1
                    gpu_frames = gpu_frames or hasattr(item, "nv12")

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.monotonic()
    time.sleep(seconds)
    frames = sum(counts)
    elapsed = time.monotonic() - began
    stop.set()
    for worker in workers:
        worker.join(30)
    if gpu_frames:
        import torch

        torch.cuda.synchronize()
    return frames / elapsed, "nvdec" if "nvdec" in paths else "cpu"


def measure_decode_ceiling(
    clip: Path,
    *,
    seconds: float,
    fps: float | None,
    sessions: int | None = None,
    decoder: str = "auto",
) -> DecodeCeiling:
    """Decode `clip` in `sessions` readers (default: one per core) over up to one process
    per core, for `seconds`; frames per second in all and as cameras at `fps`."""
    cores = os.cpu_count() or 1
    sessions = sessions or cores
    processes = min(sessions, cores)
    shares = [
        sessions // processes + (1 if i < sessions % processes else 0) for i in range(processes)
    ]
    try:
        context = multiprocessing.get_context("spawn")
        with context.Pool(processes) as pool:
            answers = pool.starmap(
                _decode_for, [(str(clip), share, seconds, decoder) for share in shares]
            )
    except Exception as exc:  # a decoder that fails is a result, not the end of the run
        return DecodeCeiling(
            decode_path="unknown",
            sessions=sessions,
            processes=processes,
            seconds=seconds,
            frames_per_s=0.0,
            streams_equivalent=None,
            error=f"{type(exc).__name__}: {exc}",
        )
    rate = sum(r for r, _ in answers)
    return DecodeCeiling(
        decode_path="nvdec" if any(p == "nvdec" for _, p in answers) else "cpu",
        sessions=sessions,
        processes=processes,
        seconds=seconds,
        frames_per_s=round(rate, 1),
        streams_equivalent=round(rate / fps, 1) if fps else None,
    )


__all__ = ["measure_decode_ceiling"]
