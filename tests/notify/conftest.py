"""Fixtures of the notify tests: the app they drive (the tiny model, a clip, settings, a client)."""

from support.app_fixtures import client, clip, make_settings, tiny_model

__all__ = ["client", "clip", "make_settings", "tiny_model"]
