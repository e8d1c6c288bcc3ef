"""Small runs of every kernel for compute-sanitizer (memcheck, racecheck) on the GPU machine.

CuPy carries the tensors (lighter to start under the sanitizer than torch). Each result is also
checked against the CPU reference, so a clean sanitizer report means "correct and clean".
    compute-sanitizer --tool memcheck python3 bench/gpu/sanitize_check.py
"""

from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np

from vdet.cuda.ops import GpuOps, nv12_to_bgr, yuv_coefficients
from vdet.inference.postprocess import PostprocessParams, decode_and_nms_image
from vdet.inference.preprocess import letterbox


def main() -> None:
    ops = GpuOps()
    rng = np.random.default_rng(1)
    # Preprocess: an odd-sized BGR frame with a pitch, and an odd-sized NV12 frame.
    image = rng.integers(0, 256, (45, 71, 3), np.uint8)
    padded = cp.zeros((45, 80, 3), cp.uint8)
    padded[:, :71] = cp.asarray(image)
    out = cp.full((1, 3, 64, 96), cp.nan, cp.float32)
    ops.letterbox_bgr([padded[:, :71]], out)
    want, _ = letterbox(image, (64, 96))
    assert np.abs(cp.asnumpy(out)[0] - want).max() <= 1 / 255 + 1e-7
    y = rng.integers(0, 256, (33, 47), np.uint8)
    uv = rng.integers(0, 256, (17, 24, 2), np.uint8)
    out16 = cp.full((1, 3, 40, 40), cp.nan, cp.float16)
    ops.letterbox_nv12([cp.asarray(y)], [cp.asarray(uv)], out16, matrix="bt601")
    want, _ = letterbox(nv12_to_bgr(y, uv, yuv_coefficients("bt601")), (40, 40))
    assert np.abs(cp.asnumpy(out16)[0].astype(np.float32) - want).max() <= 1 / 255 + 1e-3

    # Decode + NMS: radix select (top_k < survivors), ties, a filter, agnostic, and N = 0.
    cases: list[tuple[int, int, dict[str, Any]]] = [
        (20, 2000, {"top_k": 300, "max_det": 100}),
        (3, 700, {"conf_threshold": 0.0, "class_agnostic": True}),
        (80, 1000, {"classes": frozenset({1, 5})}),
        (2, 0, {}),
    ]
    for nc, n, kwargs in cases:
        raw = np.empty((2, 4 + nc, n), np.float32)
        raw[:, :2] = rng.uniform(0, 640, (2, 2, n))
        raw[:, 2:4] = rng.uniform(4, 160, (2, 2, n))
        raw[:, 4:] = np.round(rng.uniform(0.2, 0.9, (2, nc, n)) * 64) / 64
        params = PostprocessParams(**kwargs)
        dets = cp.full((2, params.max_det, 6), cp.nan, cp.float32)
        count = cp.full((2,), -1, cp.int32)
        anchors = cp.full((2, params.max_det), -7, cp.int32)
        ops.decode_nms(cp.asarray(raw), dets, count, params, anchors=anchors)
        for b in range(2):
            ref, ref_anchors = decode_and_nms_image(raw[b], params)
            k = int(count[b])
            assert k == len(ref), (k, len(ref))
            assert (cp.asnumpy(anchors)[b, :k] == ref_anchors).all()
    cp.cuda.runtime.deviceSynchronize()
    print("sanitize_check: all kernels ran and matched the references")


if __name__ == "__main__":
    main()
