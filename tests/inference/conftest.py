"""Fixtures of the inference tests: tiny ONNX graphs that stand in for a detection model."""

from support.head_models import make_head, write_head_model, yolov8n_export

__all__ = ["make_head", "write_head_model", "yolov8n_export"]
