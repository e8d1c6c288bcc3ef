"""How many frames per second can the GPU infer, with nothing else on it? The ceiling that the
unpaced many-stream runs are held against besides the decode-only one.

Run on the GPU machine: python3 bench/gpu/inference_ceiling.py --out ceiling.json

For each batch size and number of concurrent runners: that many `BatchedGraphRunner`s (the
service's batched path: the demo network in FP16, vdet's decode + NMS kernel, one CUDA graph
per batch, results copied to the host and waited for) on their own CUDA streams, each in its
own thread, replaying their graph on a staged batch of 1080p frames for a fixed time.
Preprocessing and NVDEC are not included: frames are staged once. Frames per second is
batch x batches completed / seconds, summed over runners.
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

from vdet.bench.environment import environment
from vdet.core.types import ColourMatrix, ColourRange
from vdet.gpu.frame_ops import Nv12Geometry, kernel_ops
from vdet.gpu.graphs import BatchedGraphRunner, RunnerOptions
from vdet.inference.backends.torch import TorchBackend
from vdet.inference.postprocess import PostprocessParams

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "service" / "vdet" / "assets" / "demo.onnx"
PARAMS = PostprocessParams()


def _measure(backend: TorchBackend, batch: int, runners: int, seconds: float) -> dict[str, Any]:
    preprocess, decode_nms = kernel_ops(0)
    geometry = Nv12Geometry.of(
        (1920, 1080), backend.info.input_hw, ColourMatrix.BT709, ColourRange.LIMITED
    )
    frame = torch.randint(0, 256, (1620, 1920), dtype=torch.uint8, device="cuda")
    built = []
    for _ in range(runners):
        runner = BatchedGraphRunner(
            backend.network_for_batch(batch),
            input_hw=backend.info.input_hw,
            batch=batch,
            options=RunnerOptions(
                dtype=backend.dtype,
                preprocess=preprocess,
                decode_nms=decode_nms,
                blocking_wait=True,
            ),
        )
        for i in range(batch):
            runner.stage(i, frame, geometry)
        runner.finish(runner.launch(batch, PARAMS))  # warm-up and capture
        built.append(runner)
    torch.cuda.synchronize()
    counts = [0] * runners
    stop = threading.Event()
    go = threading.Barrier(runners + 1)

    def loop(index: int) -> None:
        runner = built[index]
        go.wait()
        while not stop.is_set():
            runner.finish(runner.launch(batch, PARAMS))
            counts[index] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(runners)]
    for thread in threads:
        thread.start()
    go.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    replayed = all(r.captures >= 1 and r.eager_runs == 0 for r in built)
    for runner in built:
        runner.close()
    return {
        "batch": batch,
        "runners": runners,
        "seconds": round(wall, 3),
        "batches": sum(counts),
        "frames_per_s": round(batch * sum(counts) / wall, 1),
        "replayed": replayed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,16,32")
    parser.add_argument("--runners", default="1,4,8")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    backend = TorchBackend(DEMO, fp16=True, cuda_graph=False)
    runs = []
    for batch in (int(b) for b in args.batches.split(",")):
        for runners in (int(r) for r in args.runners.split(",")):
            run = _measure(backend, batch, runners, args.seconds)
            runs.append(run)
            print(json.dumps(run), flush=True)
    result = {
        "benchmark": "inference ceiling: batched graphs alone (demo network FP16 + decode/NMS)",
        "environment": environment(),
        "gpu": torch.cuda.get_device_name(0),
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=1))
    best = max(runs, key=lambda r: r["frames_per_s"])
    print(f"best: {best['frames_per_s']} frames/s at batch {best['batch']} x {best['runners']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
