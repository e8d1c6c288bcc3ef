"""What a request may cost: body sizes, read timeouts, concurrent uploads (`limits`)."""

from __future__ import annotations

from pydantic import Field

from vdet.config.base import MiB, Strict


class LimitSettings(Strict):
    """What one HTTP request may cost before it is refused (see vdet.api.limits).

    Checked before the body is read or parsed: a request over a limit costs a few kilobytes
    and a few microseconds of the event loop, whoever sends it.
    """

    max_json_body_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * MiB,
        description="Largest body of the JSON endpoints (POST /v1/streams, PATCH); "
        "POST /v1/detect has max_upload_bytes instead.",
    )
    max_head_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        le=MiB,
        description="Largest request head (request line and headers): a larger one is "
        "answered 431 and its connection closed while it is still being read, before the "
        "API key is checked or the request routed.",
    )
    max_header_count: int = Field(
        default=100,
        ge=8,
        le=1000,
        description="Most header lines a request head may have (431 beyond).",
    )
    header_timeout_s: float = Field(
        default=10.0,
        ge=0.5,
        le=300.0,
        description="A connection that has not sent a complete request head this long after "
        "connecting (or after starting its next request) is closed.",
    )
    body_timeout_s: float = Field(
        default=30.0,
        ge=0.5,
        le=3600.0,
        description="The whole request body must arrive within this many seconds of the "
        "request head; else 408 and the connection is closed.",
    )
    body_stall_timeout_s: float = Field(
        default=5.0,
        ge=0.5,
        le=3600.0,
        description="A request body's bytes must keep coming: none for this long (from the "
        "request head, or since the last ones) is answered 408 and the connection closed. "
        "Frees an upload's slot of max_concurrent_detect when its sender stalls, long before "
        "body_timeout_s.",
    )
    max_concurrent_detect: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="POST /v1/detect requests handled at once (bodies being received "
        "included); more get 503 with Retry-After.",
    )
    max_image_pixels: int = Field(
        default=1 << 24,
        ge=1 << 16,
        le=1 << 28,
        description="Largest image POST /v1/detect takes (width x height, read from the "
        "header before decoding; 16 MP by default).",
    )
    decode_budget_pixels: int = Field(
        default=1 << 24,
        ge=1 << 16,
        le=1 << 30,
        description="Decoded pixels the uploads being decoded share: a decode waits for its "
        "share (up to 10 s, then 503). A JPEG costs the pixels of its reduced decode (about "
        "the model's input size), other formats their full size (twice for palette and "
        "16-bit images). About 4 bytes of memory per pixel: the default, 16 MP (one "
        "max_image_pixels image, or eight 1080p PNGs), bounds decoding at about 70 MB however "
        "many uploads are admitted.",
    )
    max_websocket_clients: int = Field(
        default=256,
        ge=1,
        le=65536,
        description="WebSocket event clients connected at once, all feeds together; more are "
        "refused in the handshake (503, or close code 1013).",
    )
    max_websocket_clients_per_stream: int = Field(
        default=64,
        ge=1,
        le=65536,
        description="WebSocket event clients of one stream's feed at once (the all-streams "
        "feed /v1/events counts as one stream).",
    )
    retry_after_s: int = Field(
        default=1, ge=1, le=3600, description="Retry-After sent with a 503 for a busy detect."
    )
