"""Event clips: the camera's own video around zone and line events (recorder, ring, store)."""
