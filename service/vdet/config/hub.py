"""The results hub's replay buffers and its WebSocket subscribers' queues (`hub`)."""

from __future__ import annotations

from pydantic import Field

from vdet.config.base import Strict


class HubSettings(Strict):
    """How many results are kept for replay and how far a WebSocket client may fall behind."""

    capacity_per_source: int = Field(
        default=256, ge=1, le=100_000, description="Results kept per stream for replay."
    )
    # Sized for a full GPU node (64 streams at 30 fps, about 2,000 results/s): the replay keeps
    # about 8 s of all streams, and a client may be about 1 s behind before it is cut off.
    capacity_total: int = Field(
        default=16384, ge=1, le=1_000_000, description="Results kept across all streams."
    )
    subscriber_queue_size: int = Field(
        default=2048,
        ge=1,
        le=100_000,
        description="Results a WebSocket client may fall behind before it is disconnected as "
        "lagging (it can resume from the replay buffer).",
    )
    send_timeout_s: float = Field(
        default=5.0,
        ge=0.1,
        le=60.0,
        description="A WebSocket message that takes longer than this to go out (the client "
        "is not reading) makes the client lagging: if it reads again within as long, it gets "
        "that message and `lagging` with its resume point, then is disconnected; if not, it "
        "is disconnected. Below uvicorn's 20 s keepalive ping timeout, which would cut it "
        "without a word.",
    )
    event_history: int = Field(
        default=10_000,
        ge=0,
        le=1_000_000,
        description="Zone and line events of all streams kept in memory for "
        "GET /v1/events/history and the web page's event list (about 300 bytes each); the "
        "oldest go first. 0: no history.",
    )
