"""Offline model work: Ultralytics checkpoint to ONNX (`export`), INT8 calibration (`quantize`,
with the CPU build's graph rewrites in `cpu_fusions`), training the demo model (`train`), mAP and
tracking scores (`evaluation`, `tracking_evaluation`) and synthetic scenes with exact truth
(`dataset`). None of it serves."""
