"""The HTTP + WebSocket API: `vdet.api.app.create_app(settings)` builds the FastAPI app."""
