"""INT8 post-training quantization: calibration frames -> a Q/DQ ONNX for TensorRT, or for
ONNX Runtime on the CPU.

This module owns the offline quantization stage: collecting calibration frames (a folder of
images, a video file, an RTSP/HTTP stream, or a .npy of frames already letterboxed),
preprocessing them with the serving `letterbox` so that calibration sees exactly what inference
will see, running NVIDIA ModelOpt's ONNX post-training quantization (calibrated with ONNX
Runtime on the CPU), checking that the result has the structure TensorRT's explicit quantization
expects, and writing it atomically. For the CPU (`quantize_onnx_for_cpu`) it runs ONNX
Runtime's own static quantization instead, in the form its CPU kernels are fast at. It also
makes the FP16 model that accuracy comparisons use.
It must not evaluate accuracy (`vdet.modelkit.evaluation` does) nor build engines.

What TensorRT's explicit quantization takes, and what `check_qdq_model` enforces:

* Activations: a QuantizeLinear -> DequantizeLinear pair, per-tensor (scalar) scale,
  int8 zero point 0 (symmetric).
* Conv weights: int8 initializers (ModelOpt's ``dq_only``) or FP32 ones behind a
  QuantizeLinear, then a DequantizeLinear with one scale per output channel on axis 0 and int8
  zero points 0.
* Every scale finite and positive.

ModelOpt (``nvidia-modelopt``, the `quant` extra) is imported only when quantizing; serving
never needs it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import re
import secrets
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
from onnx import numpy_helper

from vdet.core.extras import needs_extra
from vdet.core.model import ModelError, ModelInfo, file_sha256, load_model_info
from vdet.core.types import FloatArray
from vdet.inference.preprocess import letterbox
from vdet.modelkit.cpu_fusions import fuse_for_onnxruntime_cpu

log = logging.getLogger(__name__)

CALIBRATION_METHODS = ("entropy", "max")
DEFAULT_CALIBRATION_FRAMES = 500
HIGH_PRECISION_TYPES = ("fp32", "fp16")
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"})
FRAMES_SUFFIX = ".npy"

# Node-name patterns (re.match) kept in higher precision by default, for the Ultralytics YOLOv8
# graph; chosen by the layer sensitivity study in docs/quantization.md. For an export whose
# head is another module (YOLO11's is 23) they are moved onto it (`default_nodes_to_exclude`).
# Patterns that match no node of another model are ignored.
DEFAULT_NODES_TO_EXCLUDE: tuple[str, ...] = (
    r"/model\.22/dfl/",  # DFL: softmax over 16 box bins, then a fixed 1x1 conv (-4.7 points)
    r"/model\.22/cv2\.\d+/cv2\.\d+\.2/",  # the box branch's last 1x1 convs (-1.5 points)
)

# What `quantize_onnx_for_cpu` puts on uint8 besides the convolutions: the operators between
# them (each SiLU's Sigmoid and Mul, the C2f blocks' Split, Add and Concat, SPPF's pools, the
# neck's upsampling), which ONNX Runtime then runs as QLinearSigmoid, QLinearMul,
# QLinearConcat... on the uint8 tensors instead of dequantizing, computing in float and
# quantizing again around each of them (3.9 + 2.9 ms of Q/DQ and 5.3 ms of SiLU a 384x640
# frame, one thread). Only where the detection head can be told apart (`detect_head`): its own
# operators stay float, as its output puts box coordinates and class scores side by side, which
# one uint8 scale would ruin (every score rounds to 0).
CPU_QUANTIZED_OPS: tuple[str, ...] = (
    "Conv",
    "Sigmoid",
    "Mul",
    "Add",
    "Concat",
    "Split",
    "MaxPool",
    "Resize",
)
_ULTRALYTICS_MODULE = re.compile(r"/model\.\d+/")  # how an Ultralytics export names nodes
_YOLOV8_HEAD = r"/model\.22/"

_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
_INT8 = onnx.TensorProto.INT8
_METADATA_KEY = "vdet_quantization"


class QuantizeError(ValueError):
    """The calibration input or the model cannot be used; the message says what to change."""


@dataclass(frozen=True)
class CalibrationFrames:
    """Calibration inputs exactly as serving feeds the network.

    `batch` is (n, 3, H, W) float32 RGB in [0, 1], letterboxed; `picked` is each frame's index in
    its source (file order for a folder, frame number for a video); `available` is how many
    frames or files the source had (None for a live stream, whose end is not known).
    """

    batch: FloatArray
    source: str
    picked: tuple[int, ...]
    available: int | None

    def __post_init__(self) -> None:
        b = self.batch
        if b.dtype != np.float32 or b.ndim != 4 or b.shape[1] != 3:
            raise ValueError(f"batch must be (n, 3, H, W) float32, got {b.shape} {b.dtype}")
        if len(self.picked) != len(b):
            raise ValueError(f"picked has {len(self.picked)} indexes for {len(b)} frames")

    @property
    def input_hw(self) -> tuple[int, int]:
        return int(self.batch.shape[2]), int(self.batch.shape[3])

    def __len__(self) -> int:
        return len(self.batch)


@dataclass(frozen=True)
class QdqSummary:
    """What `check_qdq_model` found: counts of each kind of Q/DQ site and the FP convs."""

    activation_pairs: int
    weight_dequantizers: int
    quantized_convs: tuple[str, ...]
    float_convs: tuple[str, ...]


@dataclass(frozen=True)
class QuantizeResult:
    output: Path
    sha256: str
    method: str
    frames: int
    excluded_patterns: tuple[str, ...]
    summary: QdqSummary
    seconds: float
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": str(self.output),
            "sha256": self.sha256,
            "method": self.method,
            "frames": self.frames,
            "excluded_patterns": list(self.excluded_patterns),
            "quantized_convs": len(self.summary.quantized_convs),
            "float_convs": list(self.summary.float_convs),
            "activation_qdq_pairs": self.summary.activation_pairs,
            "seconds": self.seconds,
        }


# --- calibration frames -------------------------------------------------------------------


def collect_calibration_frames(
    source: str | os.PathLike[str],
    input_hw: tuple[int, int],
    count: int = DEFAULT_CALIBRATION_FRAMES,
    *,
    every: int | None = None,
    allow_fewer: bool = False,
) -> CalibrationFrames:
    """Read up to `count` frames from `source` and letterbox them to `input_hw`.

    `source` is a folder of images (searched recursively, in sorted path order), a video file,
    an rtsp/rtsps/http/https URL, or a .npy of (n, 3, H, W) float32 frames already letterboxed.
    Frames are picked evenly over a folder or a video file (or every `every`-th one when given);
    a live stream gives every `every`-th frame (default: each one) until `count` are in.
    Fewer frames than `count` is an error unless `allow_fewer`; none at all always is.
    """
    if isinstance(count, bool) or count < 1:
        raise QuantizeError(f"the number of calibration frames must be positive, got {count}")
    if every is not None and (isinstance(every, bool) or every < 1):
        raise QuantizeError(f"--every must be a positive frame step, got {every}")
    text = os.fspath(source)
    path = Path(text)
    if path.is_dir():
        frames = _frames_from_folder(path, input_hw, count, every)
    elif path.suffix.lower() == FRAMES_SUFFIX and path.is_file():
        frames = _frames_from_npy(path, count, every)
    else:
        frames = _frames_from_video(text, input_hw, count, every)
    if len(frames) == 0:
        raise QuantizeError(f"{text}: no calibration frames could be taken from it")
    if len(frames) < count and not allow_fewer:
        raise QuantizeError(
            f"{text}: only {len(frames)} calibration frames available, {count} asked; "
            "give more frames, ask for fewer (--frames) or pass --allow-fewer"
        )
    return frames


def evenly_spaced(available: int, count: int) -> list[int]:
    """`count` distinct indexes spread evenly over range(available), or all of them."""
    if available <= count:
        return list(range(available))
    return [i * available // count for i in range(count)]


def _picks(available: int, count: int, every: int | None) -> list[int]:
    if every is None:
        return evenly_spaced(available, count)
    return list(range(0, available, every))[:count]


def _frames_from_folder(
    root: Path, input_hw: tuple[int, int], count: int, every: int | None
) -> CalibrationFrames:
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise QuantizeError(
            f"{root}: no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in this folder or below"
        )
    picked = _picks(len(files), count, every)
    H, W = input_hw
    batch = np.empty((len(picked), 3, H, W), np.float32)
    for slot, index in enumerate(picked):
        image = cv2.imread(str(files[index]), cv2.IMREAD_COLOR)
        if image is None:
            raise QuantizeError(f"cannot read image {files[index]} (corrupt or not an image)")
        letterbox(np.asarray(image, np.uint8), input_hw, out=batch[slot])
    return CalibrationFrames(batch, str(root), tuple(picked), len(files))


def _frames_from_npy(path: Path, count: int, every: int | None) -> CalibrationFrames:
    try:
        data = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise QuantizeError(f"{path}: not a readable .npy array ({exc})") from None
    if data.ndim != 4 or data.shape[1] != 3 or data.dtype != np.float32:
        raise QuantizeError(
            f"{path}: frames must be (n, 3, H, W) float32 letterboxed RGB, "
            f"got {data.shape} {data.dtype}"
        )
    picked = _picks(len(data), count, every)
    batch = np.ascontiguousarray(data[picked], dtype=np.float32)
    if batch.size and (not np.isfinite(batch).all() or batch.min() < 0 or batch.max() > 1):
        raise QuantizeError(f"{path}: values must be in [0, 1] (uint8 / 255, as letterbox makes)")
    return CalibrationFrames(batch, str(path), tuple(picked), len(data))


def _frames_from_video(
    url: str, input_hw: tuple[int, int], count: int, every: int | None
) -> CalibrationFrames:
    import av

    from vdet.ingest.reader import DecodeError, SourceError, SourceReader
    from vdet.ingest.urls import is_network_url, validate_source_url

    try:
        url = validate_source_url(url)
    except ValueError as exc:
        raise QuantizeError(f"calibration source: {exc}") from None
    live = is_network_url(url)
    available = None if live else _video_frame_count(url)
    step = every or (max(1, available // count) if available else 1)
    H, W = input_hw
    batch = np.empty((count, 3, H, W), np.float32)
    picked: list[int] = []
    decoded = 0
    with SourceReader(url, source_id="calibration") as reader:
        try:
            reader.open()
            for item in reader.frames():
                if isinstance(item, DecodeError):
                    continue
                decoded += 1
                if item.index % step == 0:
                    letterbox(item.image_bgr, (H, W), out=batch[len(picked)])
                    picked.append(item.index)
                    if len(picked) == count:
                        break
        except (av.FFmpegError, OSError, RuntimeError, SourceError) as exc:
            if not picked:
                raise QuantizeError(f"cannot read video from {url}: {exc}") from None
            # A stream that drops mid-way still gave usable frames; the count check decides.
            log.warning("calibration source %s stopped after %d frames: %s", url, decoded, exc)
    n = len(picked)
    # A short source copies out what it gave rather than keep the whole allocation alive.
    return CalibrationFrames(
        batch if n == count else batch[:n].copy(), url, tuple(picked), available
    )


def _video_frame_count(path: str) -> int | None:
    """Frames in a video file as its container states them (or duration x rate), else None."""
    import av

    try:
        with av.open(path) as container:
            if not container.streams.video:
                return None
            stream = container.streams.video[0]
            if stream.frames:
                return int(stream.frames)
            rate = stream.average_rate or stream.guessed_rate
            if container.duration and rate:
                return max(1, int(container.duration / 1_000_000 * float(rate)))
    except (av.FFmpegError, OSError):
        return None
    return None


def save_calibration_frames(frames: CalibrationFrames, path: Path) -> None:
    """Write the letterboxed frames as .npy, to calibrate several runs without re-decoding."""
    with _atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, frames.batch, allow_pickle=False)


# --- quantization ---------------------------------------------------------------------------


def quantize_onnx(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str],
    frames: CalibrationFrames,
    method: str = "entropy",
    nodes_to_exclude: Sequence[str] | None = None,
    high_precision: str = "fp32",
    calibration_cache: str | os.PathLike[str] | None = None,
) -> QuantizeResult:
    """Calibrate `model` on `frames` and write the Q/DQ model to `output` (atomically).

    `method` is one of CALIBRATION_METHODS. `nodes_to_exclude` are node-name regexes
    (`re.match`) that stay in `high_precision`; None uses DEFAULT_NODES_TO_EXCLUDE (on this
    model's head: `default_nodes_to_exclude`) where they match, and every pattern given
    explicitly must match some node. `calibration_cache` (a TensorRT-format cache, see
    `write_calibration_cache`) supplies activation scales instead of those calibrated on
    `frames`, for sweeps that re-place Q/DQ without re-calibrating.
    Nothing is left at `output` unless the whole run and its checks succeed.
    """
    start = time.perf_counter()
    if high_precision not in HIGH_PRECISION_TYPES:
        raise QuantizeError(f"high precision must be one of {HIGH_PRECISION_TYPES}")
    job = _Job.checked(model, output, frames, method)
    patterns = _exclusion_patterns(job.proto, nodes_to_exclude)

    with tempfile.TemporaryDirectory(prefix="vdet-quantize-") as work:
        # ModelOpt writes intermediate files beside its input; keep them out of the user's
        # folders (and out of read-only package assets).
        source = Path(work) / "model.onnx"
        quantized = Path(work) / "model.int8.onnx"
        shutil.copyfile(job.model, source)
        cache = None if calibration_cache is None else str(Path(calibration_cache).resolve())
        _run_modelopt(
            source, quantized, {job.input_name: job.batch}, method, patterns, high_precision, cache
        )
        result = onnx.load(str(quantized))

    provenance = {
        "tool": "nvidia-modelopt",
        "tool_version": _version("nvidia-modelopt"),
        "method": method,
        "frames": len(job.batch),
        "calibration_source": frames.source,
        "excluded_patterns": list(patterns),
        "high_precision": high_precision,
        "source_model_sha256": job.info.sha256,
    }
    return job.write(result, check_qdq_model(result), patterns, provenance, start)


def quantize_onnx_for_cpu(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str],
    frames: CalibrationFrames,
    method: str = "max",
    nodes_to_exclude: Sequence[str] | None = None,
) -> QuantizeResult:
    """Calibrate `model` on `frames` and write a Q/DQ model for ONNX Runtime's CPU provider.

    TensorRT's model (`quantize_onnx`: symmetric int8 everywhere) runs slower than FP32 in ONNX
    Runtime on a CPU without VNNI (0.75x on the 2-core AVX2 machine of docs/quantization.md).
    What its CPU kernels are fast at is uint8 activations (asymmetric, a zero point per tensor)
    with int8 weights per output channel, each Q/DQ'd Conv folded into a QLinearConv, and the
    operators between convolutions run on uint8 too (`CPU_QUANTIZED_OPS`). The Detect head's
    own operators stay float (`detect_head`; a model where it cannot be told apart gets its
    convolutions quantized and nothing else), and the same layers as `quantize_onnx` stay float
    (`nodes_to_exclude`, same rules). The SiLUs left float and the DFL expectation are then
    rewritten into forms ONNX Runtime runs in fewer passes (vdet.modelkit.cpu_fusions; outputs
    unchanged). `method`: "max" (min/max of each tensor over the frames) or "entropy". Written
    atomically.
    """
    start = time.perf_counter()
    job = _Job.checked(model, output, frames, method)
    with tempfile.TemporaryDirectory(prefix="vdet-quantize-cpu-") as work:
        source = Path(work) / "model.onnx"
        prepared = Path(work) / "model.prepared.onnx"
        quantized = Path(work) / "model.int8.onnx"
        frames_file = Path(work) / "frames.npy"
        shutil.copyfile(job.model, source)
        np.save(frames_file, job.batch)
        # In a fresh process: ModelOpt (`quantize_onnx`) patches ONNX Runtime's calibrators
        # for the rest of any process it ran in, and they then refuse this model.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            patterns, quantized_ops, float_head = pool.submit(
                _ort_quantize_static,
                source,
                prepared,
                quantized,
                frames_file,
                job.input_name,
                job.info.batch or 1,
                None if nodes_to_exclude is None else tuple(nodes_to_exclude),
                method,
            ).result()
        result = onnx.load(str(quantized))
    result, fusions = fuse_for_onnxruntime_cpu(result)

    provenance = {
        "tool": "onnxruntime.quantization",
        "tool_version": _version("onnxruntime"),
        "target": "cpu",
        "method": method,
        "frames": len(job.batch),
        "calibration_source": frames.source,
        "excluded_patterns": list(patterns),
        "activations": "uint8 per tensor",
        "quantized_ops": list(quantized_ops),
        "float_head": float_head,
        "weights": "int8 per output channel",
        # vdet.modelkit.cpu_fusions: same outputs, fewer passes over each feature map
        "fused_silu": fusions.silu,
        "fused_dfl": fusions.dfl,
        "source_model_sha256": job.info.sha256,
    }
    convs = [node for node in result.graph.node if node.op_type == "Conv"]
    producers = {out: node for node in result.graph.node for out in node.output}
    quantized_convs = tuple(
        n.name
        for n in convs
        if (w := producers.get(n.input[1])) is not None and w.op_type == "DequantizeLinear"
    )
    quantized_names = set(quantized_convs)
    summary = QdqSummary(
        activation_pairs=sum(1 for node in result.graph.node if node.op_type == "QuantizeLinear"),
        weight_dequantizers=len(quantized_convs),
        quantized_convs=quantized_convs,
        float_convs=tuple(n.name for n in convs if n.name not in quantized_names),
    )
    if not quantized_convs:
        raise QuantizeError(f"{job.model}: no convolution was quantized")
    return job.write(result, summary, patterns, provenance, start)


@dataclass(frozen=True)
class _Job:
    """One quantization's checked inputs, and how every target writes its result."""

    model: Path
    output: Path
    method: str
    info: ModelInfo
    proto: onnx.ModelProto
    batch: FloatArray  # the calibration frames, whole batches of a static-batch model
    input_name: str

    @classmethod
    def checked(
        cls,
        model: str | os.PathLike[str],
        output: str | os.PathLike[str],
        frames: CalibrationFrames,
        method: str,
    ) -> _Job:
        if method not in CALIBRATION_METHODS:
            raise QuantizeError(f"unknown calibration method {method!r}; use {CALIBRATION_METHODS}")
        model_path, output_path = Path(model), Path(output)
        info = _model_info(model_path)
        proto = onnx.load(str(model_path))
        _check_unquantized(proto, model_path)
        _check_frames(frames, info)
        _check_output_path(output_path, model_path)
        batch = _whole_batches(frames.batch, info.batch)
        return cls(model_path, output_path, method, info, proto, batch, _input_name(proto))

    def write(
        self,
        result: onnx.ModelProto,
        summary: QdqSummary,
        patterns: tuple[str, ...],
        provenance: dict[str, Any],
        started: float,
    ) -> QuantizeResult:
        """Stamp the source's metadata and the provenance on `result`, check that ONNX Runtime
        runs it, and write it atomically."""
        _copy_metadata(self.proto, result, {_METADATA_KEY: json.dumps(provenance, sort_keys=True)})
        _smoke_run(result, self.input_name, self.batch[:1], self.info)
        with _atomic_path(self.output) as tmp:
            onnx.save(result, str(tmp))
        return QuantizeResult(
            output=self.output,
            sha256=file_sha256(self.output),
            method=self.method,
            frames=len(self.batch),
            excluded_patterns=patterns,
            summary=summary,
            seconds=round(time.perf_counter() - started, 2),
            metadata=provenance,
        )


def _ort_quantize_static(
    source: Path,
    prepared: Path,
    output: Path,
    frames_file: Path,
    input_name: str,
    step: int,
    nodes_to_exclude: tuple[str, ...] | None,
    method: str,
) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """ONNX Runtime's pre-pass and static quantization of `source` into `output`, calibrated
    on the frames in `frames_file` (`step` at a time). Returns the exclusion patterns that
    applied, the operator types quantized, and the head pattern whose operators stayed float
    (None: no head found, convolutions only)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    batch = np.load(frames_file)

    class _Frames(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._next = 0

        def get_next(self) -> dict[str, FloatArray] | None:
            if self._next >= len(batch):
                return None
            chunk = batch[self._next : self._next + step]
            self._next += step
            return {input_name: chunk}

    # ONNX Runtime's recommended pre-pass (shapes, and the graph fused as it will run); the
    # symbolic shape pass is skipped: it rejects the dynamic height and width.
    quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
    prepared_proto = onnx.load(str(prepared))
    patterns = _exclusion_patterns(prepared_proto, nodes_to_exclude)
    float_head = detect_head(prepared_proto)
    quantized_ops = CPU_QUANTIZED_OPS if float_head is not None else ("Conv",)
    excluded = [
        node.name
        for node in prepared_proto.graph.node
        if any(re.match(pattern, node.name) for pattern in patterns)
        or (float_head is not None and node.op_type != "Conv" and re.match(float_head, node.name))
    ]
    quantize_static(
        str(prepared),
        str(output),
        _Frames(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=list(quantized_ops),
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=excluded,
        calibrate_method=(
            CalibrationMethod.MinMax if method == "max" else CalibrationMethod.Entropy
        ),
    )
    return patterns, quantized_ops, float_head


def default_nodes_to_exclude(proto: onnx.ModelProto) -> tuple[str, ...]:
    """DEFAULT_NODES_TO_EXCLUDE on this model's detection head (`detect_head`): the same layers
    of YOLO11's head (module 23) as of YOLOv8's (22)."""
    head = detect_head(proto)
    if head is None:
        return DEFAULT_NODES_TO_EXCLUDE
    return tuple(p.replace(_YOLOV8_HEAD, head, 1) for p in DEFAULT_NODES_TO_EXCLUDE)


def detect_head(proto: onnx.ModelProto) -> str | None:
    """A node-name pattern for the detection head: the Ultralytics module (`/model.N/`: 22 in
    YOLOv8, 23 in YOLO11) whose node produces the model's output. None when the producer is not
    named that way (another exporter): the head cannot be told apart."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    for output in proto.graph.output:
        node = producers.get(output.name)
        module = None if node is None else _ULTRALYTICS_MODULE.match(node.name)
        if module is not None:
            return re.escape(module.group(0))
    return None


def convert_fp16(model: str | os.PathLike[str], output: str | os.PathLike[str]) -> Path:
    """FP16 copy of `model` with FP32 inputs and outputs (ModelOpt AutoCast), written atomically.

    AutoCast inserts the casts that ONNX Runtime needs around ops without FP16 kernels, where
    onnxconverter-common's converter leaves type mismatches behind (Resize, in YOLOv8).
    """
    model_path, output_path = Path(model), Path(output)
    _model_info(model_path)
    _check_output_path(output_path, model_path)
    proto = onnx.load(str(model_path))
    with _quiet_modelopt():
        from modelopt.onnx.autocast import convert_to_f16

        half = convert_to_f16(proto, low_precision_type="fp16", keep_io_types=True)
    _copy_metadata(proto, half, {})
    with _atomic_path(output_path) as tmp:
        onnx.save(half, str(tmp))
    return output_path


def _run_modelopt(
    source: Path,
    output: Path,
    calibration: dict[str, FloatArray],
    method: str,
    patterns: Sequence[str],
    high_precision: str,
    calibration_cache: str | None,
) -> None:
    with _quiet_modelopt():
        try:
            from modelopt.onnx.quantization import quantize
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise QuantizeError(needs_extra("quantizing (NVIDIA ModelOpt)", "quant")) from exc
        _ignore_shadowed_tensorrt()
        quantize(
            onnx_path=str(source),
            quantize_mode="int8",
            calibration_data=calibration,
            calibration_method=method,
            calibration_cache_path=calibration_cache,
            # Calibrate with ONNX Runtime's CPU provider: the same numbers on any machine.
            calibration_eps=["cpu"],
            nodes_to_exclude=list(patterns),
            high_precision_dtype=high_precision,
            # Weights stored as int8 behind a DequantizeLinear: 4x smaller, and what TensorRT
            # would fold the Q/DQ on FP32 weights into anyway.
            dq_only=True,
            output_path=str(output),
            log_level="WARNING",
        )
    if not output.is_file():
        raise RuntimeError(f"ModelOpt wrote no model at {output}")


def _ignore_shadowed_tensorrt() -> None:
    """Only a real TensorRT counts as TensorRT.

    ModelOpt asks TensorRT about custom layers whenever `import tensorrt` succeeds; a folder
    named `tensorrt` on sys.path (a test package, say) imports as an empty namespace package
    and would make it fail on `trt.Logger`. Without TensorRT it checks ops with ONNX alone.
    """
    from modelopt.onnx import trt_utils

    if getattr(trt_utils, "TRT_PYTHON_AVAILABLE", False) and not hasattr(
        getattr(trt_utils, "trt", None), "Logger"
    ):
        trt_utils.TRT_PYTHON_AVAILABLE = False


class _ModelOptNoise(logging.Filter):
    """Lets ModelOpt's errors through, except its complaint that a CPU machine has no NVML."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR and "GPU count" not in record.getMessage()


@contextlib.contextmanager
def _quiet_modelopt() -> Iterator[None]:
    """Keep ModelOpt's and ONNX Runtime's calibration chatter off stdout (ours is JSON).

    ModelOpt re-configures its loggers on every call (level and a stdout handler), so a filter
    on the loggers, not a level, is what sticks.
    """
    noise = _ModelOptNoise()
    loggers = [logging.getLogger(n) for n in ("modelopt.onnx", "modelopt.onnx.autocast")]
    for logger in loggers:
        logger.addFilter(noise)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(noise)


# --- structure checks -----------------------------------------------------------------------


def check_qdq_model(model: onnx.ModelProto) -> QdqSummary:
    """Check that `model` is a Q/DQ graph TensorRT's explicit quantization builds as int8.

    Raises QuantizeError naming the first offending node. See the module docstring for the rules.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def const(name: str, node: onnx.NodeProto, what: str) -> np.ndarray[Any, Any]:
        if name not in inits:
            raise QuantizeError(f"{node.name}: {what} {name!r} is not an initializer")
        return numpy_helper.to_array(inits[name])

    activation_pairs = 0
    weight_dqs = 0
    weight_dq_outputs: set[str] = set()
    for node in graph.node:
        if node.op_type not in _QDQ_OPS:
            continue
        if len(node.input) < 3 or not node.input[2]:
            raise QuantizeError(f"{node.name}: no zero point (would default to uint8)")
        scale = const(node.input[1], node, "scale").astype(np.float64)
        zero = inits.get(node.input[2])
        if zero is None or zero.data_type != _INT8:
            raise QuantizeError(f"{node.name}: zero point must be an int8 initializer")
        if np.any(numpy_helper.to_array(zero) != 0):
            raise QuantizeError(f"{node.name}: zero point is not 0 (TensorRT is symmetric)")
        if scale.size == 0 or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise QuantizeError(f"{node.name}: scales must be finite and positive")
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        is_weight = node.input[0] in inits or (
            node.op_type == "DequantizeLinear"
            and node.input[0] in producers
            and producers[node.input[0]].input[0] in inits
        )
        if node.op_type == "QuantizeLinear":
            users = consumers.get(node.output[0], [])
            if not users or any(u.op_type != "DequantizeLinear" for u in users):
                raise QuantizeError(f"{node.name}: QuantizeLinear must feed DequantizeLinear only")
            if not is_weight:
                activation_pairs += 1
                if scale.size != 1:
                    raise QuantizeError(f"{node.name}: activation scale must be per-tensor")
            continue
        # DequantizeLinear
        if is_weight:
            weight_dqs += 1
            weight_dq_outputs.add(node.output[0])
            source = node.input[0]
            weights = inits.get(source)
            if weights is not None and weights.data_type != _INT8:
                raise QuantizeError(f"{node.name}: stored weights must be int8")
            if scale.size > 1:
                channels = weights.dims[0] if weights is not None else scale.size
                if axis != 0 or scale.size != channels:
                    raise QuantizeError(
                        f"{node.name}: weight scales must be per output channel on axis 0, "
                        f"got {scale.size} scales on axis {axis}"
                    )
        else:
            producer = producers.get(node.input[0])
            if producer is None or producer.op_type != "QuantizeLinear":
                raise QuantizeError(
                    f"{node.name}: activation DequantizeLinear without its Quantize"
                )
            if scale.size != 1:
                raise QuantizeError(f"{node.name}: activation scale must be per-tensor")

    quantized: list[str] = []
    floats: list[str] = []
    for node in graph.node:
        if node.op_type != "Conv":
            continue
        if node.input[1] in weight_dq_outputs:
            wdq = producers[node.input[1]]
            scale = numpy_helper.to_array(inits[wdq.input[1]])
            if scale.size <= 1 and _out_channels(node, inits, producers) > 1:
                raise QuantizeError(f"{node.name}: conv weights must be quantized per channel")
            source = producers.get(node.input[0])
            if source is None or source.op_type != "DequantizeLinear":
                raise QuantizeError(f"{node.name}: int8 weights but a float input")
            quantized.append(node.name)
        else:
            floats.append(node.name)
    if not quantized:
        raise QuantizeError("no Conv is quantized: the model has no int8 layers")
    return QdqSummary(activation_pairs, weight_dqs, tuple(quantized), tuple(floats))


def _out_channels(
    node: onnx.NodeProto,
    inits: dict[str, onnx.TensorProto],
    producers: dict[str, onnx.NodeProto],
) -> int:
    name = producers[node.input[1]].input[0]
    if name in inits:
        return int(inits[name].dims[0])
    return int(inits[producers[name].input[0]].dims[0])


# --- helpers --------------------------------------------------------------------------------


def _model_info(path: Path) -> ModelInfo:
    try:
        return load_model_info(path)
    except (FileNotFoundError, ModelError) as exc:
        raise QuantizeError(str(exc)) from None


def _check_unquantized(proto: onnx.ModelProto, path: Path) -> None:
    if any(node.op_type in _QDQ_OPS for node in proto.graph.node):
        raise QuantizeError(f"{path}: already has Q/DQ nodes; quantize the FP32 model instead")


def _check_frames(frames: CalibrationFrames, info: ModelInfo) -> None:
    if frames.input_hw != info.input_hw:
        (h, w), (H, W) = frames.input_hw, info.input_hw
        raise QuantizeError(
            f"calibration frames are {h}x{w} (HxW) but {info.path} takes {H}x{W}; "
            "letterbox them to the model's input size"
        )
    if len(frames) == 0:
        raise QuantizeError("no calibration frames")
    if info.batch is not None and len(frames) < info.batch:
        raise QuantizeError(
            f"{info.path} has a fixed batch of {info.batch}; give at least that many frames"
        )


def _whole_batches(batch: FloatArray, model_batch: int | None) -> FloatArray:
    """A static-batch model calibrates on whole batches: drop the remainder."""
    if model_batch is None or len(batch) % model_batch == 0:
        return batch
    keep = len(batch) - len(batch) % model_batch
    log.warning("fixed batch %d: calibrating on %d of %d frames", model_batch, keep, len(batch))
    return batch[:keep]


def _check_output_path(output: Path, model: Path) -> None:
    if output.suffix.lower() != ".onnx":
        raise QuantizeError(f"output must be an .onnx file, got {output}")
    if not output.parent.is_dir():
        raise QuantizeError(f"output folder does not exist: {output.parent}")
    if output.resolve() == model.resolve():
        raise QuantizeError("output would overwrite the input model")


def _exclusion_patterns(proto: onnx.ModelProto, patterns: Sequence[str] | None) -> tuple[str, ...]:
    names = [node.name for node in proto.graph.node]
    strict = patterns is not None
    chosen: list[str] = []
    for pattern in default_nodes_to_exclude(proto) if patterns is None else patterns:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise QuantizeError(f"exclude pattern {pattern!r} is not a regex: {exc}") from None
        if any(regex.match(name) for name in names):
            chosen.append(pattern)
        elif strict:
            raise QuantizeError(f"exclude pattern {pattern!r} matches no node of the model")
    return tuple(chosen)


def _input_name(proto: onnx.ModelProto) -> str:
    weights = {t.name for t in proto.graph.initializer}
    return next(str(value.name) for value in proto.graph.input if value.name not in weights)


def _copy_metadata(source: onnx.ModelProto, target: onnx.ModelProto, extra: dict[str, str]) -> None:
    """Ultralytics' metadata (names, imgsz, stride...) is what vdet reads; converters drop it."""
    entries = {p.key: p.value for p in source.metadata_props}
    entries.update(extra)
    del target.metadata_props[:]
    for key, value in entries.items():
        target.metadata_props.add(key=key, value=value)


def _smoke_run(model: onnx.ModelProto, input_name: str, batch: FloatArray, info: ModelInfo) -> None:
    """One inference in ONNX Runtime on the CPU: the model loads and gives a sane head."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # not its notes on initializers ModelOpt left unused
    session = ort.InferenceSession(
        model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    )
    feed = batch
    if info.batch is not None and len(feed) != info.batch:
        feed = np.repeat(feed, info.batch, axis=0)
    (raw,) = session.run(None, {input_name: feed})
    raw = np.asarray(raw)
    if raw.ndim != 3 or raw.shape[1] != 4 + info.num_classes or not np.isfinite(raw).all():
        raise RuntimeError(
            f"quantized model gives {raw.shape} with non-finite values or wrong rows"
        )


@contextlib.contextmanager
def _atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path`, renamed onto it only if the block succeeds."""
    # Not mkstemp: its 0600 mode would stick to the renamed file; this one gets the umask's.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def activation_scales(model: onnx.ModelProto) -> dict[str, float]:
    """Per-tensor scale of every quantized activation, by tensor name."""
    inits = {t.name: t for t in model.graph.initializer}
    scales: dict[str, float] = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] not in inits:
            scales[node.input[0]] = float(numpy_helper.to_array(inits[node.input[1]]).ravel()[0])
    return scales


def write_calibration_cache(scales: dict[str, float], path: Path) -> None:
    """Activation scales as a TensorRT calibration cache (the format ModelOpt reads back)."""
    lines = ["TRT-100-EntropyCalibration2"]
    lines += [f"{name}: {struct.pack('!f', scale).hex()}" for name, scale in sorted(scales.items())]
    with _atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")


def scale_summary(model: onnx.ModelProto) -> dict[str, list[float]]:
    """Every Q/DQ node's scales by node name (for determinism checks and reports)."""
    inits = {t.name: t for t in model.graph.initializer}
    return {
        node.name: [float(v) for v in numpy_helper.to_array(inits[node.input[1]]).ravel()]
        for node in model.graph.node
        if node.op_type in _QDQ_OPS
    }


__all__ = [
    "CALIBRATION_METHODS",
    "DEFAULT_CALIBRATION_FRAMES",
    "DEFAULT_NODES_TO_EXCLUDE",
    "CalibrationFrames",
    "QdqSummary",
    "QuantizeError",
    "QuantizeResult",
    "activation_scales",
    "check_qdq_model",
    "collect_calibration_frames",
    "convert_fp16",
    "default_nodes_to_exclude",
    "detect_head",
    "evenly_spaced",
    "quantize_onnx",
    "save_calibration_frames",
    "scale_summary",
    "write_calibration_cache",
]
