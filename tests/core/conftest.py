"""Fixtures of the core tests: tiny ONNX graphs for the model signature tests."""

from support.head_models import write_head_model, yolov8n_export

__all__ = ["write_head_model", "yolov8n_export"]
