"""The detection pipeline on one batch of frames: preprocess -> infer -> postprocess.

This package owns the per-frame computation and nothing around it (no video, queues, or HTTP).
`preprocess` and `postprocess` are the CPU reference implementations that GPU kernels are tested
against (conventions in docs/conventions.md); `backends` run the network; `model` reads and
validates model files; `detector.Detector` composes them and is the entry point for callers.
"""
