"""Fixtures of the modelkit tests."""

from support.engines import demo_int8

__all__ = ["demo_int8"]
