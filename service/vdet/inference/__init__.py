"""Frames to detections: letterbox (`preprocess`), the network (`backends`: ONNX Runtime, torch,
TensorRT, and the hand-off while an engine builds), decode + NMS back to source pixels
(`postprocess`), per-class thresholds over it (`class_thresholds`), and `detector.Detector`, which
composes them; `factory` opens the detector a service runs. `preprocess` and `postprocess` are
the CPU references the GPU kernels are tested against (docs/conventions.md). No video, queues or
HTTP here.
"""
