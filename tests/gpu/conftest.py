"""Fixtures of the GPU-side tests: random detection heads for the decode + NMS references."""

from support.head_models import make_head

__all__ = ["make_head"]
