"""Fixtures of the API tests: the tiny ONNX model, a short H.264 clip, settings and a client."""

from support.app_fixtures import client, clip, make_settings, tiny_model

__all__ = ["client", "clip", "make_settings", "tiny_model"]
