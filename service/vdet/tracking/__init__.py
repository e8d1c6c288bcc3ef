"""Object tracking per stream: track ids, zones and lines, and the events they produce."""
