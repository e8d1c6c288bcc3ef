"""Webhooks: the streams' zone and line events POSTed to HTTP endpoints (`notify.webhooks`).

The Notifier (vdet.notify.notifier) hands each result whose frame caused events that a webhook's
filter keeps to its `Webhook`: one delivery per result and webhook, the result's identifiers
with the kept events (docs/notify.md has the body). Each webhook sends its deliveries one at
a time, in order, from a bounded queue: attempts that fail on the network, time out or get 429
or 5xx are made again with growing pauses; a full queue drops its oldest delivery. Every
delivery ends counted in `vdet_webhook_deliveries_total` as delivered, failed or dropped.

Nothing here blocks the event loop: requests go out through httpx's async client. Responses
are never read past their status line. A webhook's URL and headers come from the operator's
configuration, never from a request, and are never logged with their credentials.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import logging
import time
from collections import deque
from typing import Any

import httpx

from vdet.config.notify import WebhookSettings
from vdet.core.redact import redact
from vdet.metrics.registry import Metrics
from vdet.notify.filters import EventFilter

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Vdet-Signature"
_FIRST_PAUSE_S = 0.5
_LONGEST_PAUSE_S = 30.0


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The X-Vdet-Signature value: `t=<unix time>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
    Signing the time with the body lets a receiver refuse an old delivery played again."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


class _Delivery:
    __slots__ = ("body", "published_time")

    def __init__(self, body: bytes, published_time: float) -> None:
        self.body = body
        self.published_time = published_time


@dataclasses.dataclass
class WebhookState:
    """What an operator asks of a webhook (GET /v1/webhooks): counts since the start, and the
    last success and failure with their Unix times."""

    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    retries: int = 0
    last_delivered_time: float | None = None
    last_error: str | None = None
    last_error_time: float | None = None


@dataclasses.dataclass(frozen=True)
class ProbeOutcome:
    """How a test delivery went: `error` says why it did not (HTTP status, timeout, network)."""

    delivered: bool
    error: str | None
    seconds: float


class WebhookBusyError(RuntimeError):
    """A test of this webhook is already under way."""


class Webhook:
    """One endpoint: its filter, its queue of deliveries, and the task that sends them."""

    def __init__(self, spec: WebhookSettings, client: httpx.AsyncClient, metrics: Metrics) -> None:
        self.spec = spec
        self.filter = EventFilter(spec)
        self._client = client
        self._queue: deque[_Delivery] = deque()
        self._ready = asyncio.Event()
        self._sending = False
        self._delivered = metrics.webhook_deliveries.labels(spec.id, "delivered")
        self._failed = metrics.webhook_deliveries.labels(spec.id, "failed")
        self._dropped = metrics.webhook_deliveries.labels(spec.id, "dropped")
        self._retries = metrics.webhook_retries.labels(spec.id)
        self._latency = metrics.webhook_delivery_seconds.labels(spec.id)
        self._pending = metrics.webhook_pending.labels(spec.id)
        self._pending.set(0)
        self._headers = {name: value.get_secret_value() for name, value in spec.headers.items()}
        self._headers["Content-Type"] = "application/json"
        self.where = redact(spec.url)
        self.state = WebhookState()
        self._testing = False

    @property
    def pending(self) -> int:
        return len(self._queue) + self._sending

    def offer(self, body: dict[str, Any], published_time: float) -> None:
        """Queue one delivery; the oldest waiting one gives way when the queue is full."""
        if len(self._queue) >= self.spec.max_pending:
            self._queue.popleft()
            self._count_dropped(1)
        encoded = json.dumps({"webhook": self.spec.id, **body}, separators=(",", ":")).encode()
        self._queue.append(_Delivery(encoded, published_time))
        self._pending.set(self.pending)
        self._ready.set()

    async def run(self) -> None:
        """Send the queued deliveries one at a time, in order, until cancelled."""
        while True:
            while not self._queue:
                self._ready.clear()
                await self._ready.wait()
            delivery = self._queue.popleft()
            self._sending = True
            try:
                delivered = await self._deliver(delivery)
            except asyncio.CancelledError:
                self._count_dropped(1)  # shutdown came first
                raise
            finally:
                self._sending = False
                self._pending.set(self.pending)
            now = time.time()
            if delivered:
                self.state.delivered += 1
                self.state.last_delivered_time = now
                self._delivered.inc()
                self._latency.observe(max(0.0, now - delivery.published_time))
            else:
                self.state.failed += 1
                self._failed.inc()

    def drop_pending(self) -> None:
        """Count what still waits as dropped (at shutdown)."""
        if self._queue:
            self._count_dropped(len(self._queue))
            self._queue.clear()
        self._pending.set(self.pending)

    def _count_dropped(self, count: int) -> None:
        self.state.dropped += count
        self._dropped.inc(count)

    async def _deliver(self, delivery: _Delivery) -> bool:
        pause = _FIRST_PAUSE_S
        for attempt in range(1, self.spec.max_attempts + 1):
            outcome = await self._attempt(delivery.body)
            if outcome is None:
                return True
            retry, why = outcome
            self.state.last_error, self.state.last_error_time = why, time.time()
            if not retry or attempt == self.spec.max_attempts:
                log.warning(
                    "webhook %s (%s): delivery failed after %d attempt(s): %s",
                    self.spec.id,
                    self.where,
                    attempt,
                    why,
                )
                return False
            self.state.retries += 1
            self._retries.inc()
            await asyncio.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE_S)
        return False  # max_attempts >= 1: not reached

    async def probe(self) -> ProbeOutcome:
        """One attempt of a test body now, beside the queue (its deliveries keep their order
        and counts), for an operator checking the endpoint (POST /v1/webhooks/{id}/test)."""
        if self._testing:
            raise WebhookBusyError(
                f"a test delivery of webhook {self.spec.id!r} is already under way"
            )
        self._testing = True
        try:
            now = time.time()
            body = {"webhook": self.spec.id, "test": True, "sent_time": now, "events": []}
            outcome = await self._attempt(json.dumps(body, separators=(",", ":")).encode())
        finally:
            self._testing = False
        seconds = round(time.time() - now, 6)
        if outcome is None:
            return ProbeOutcome(True, None, seconds)
        return ProbeOutcome(False, outcome[1], seconds)

    async def _attempt(self, body: bytes) -> tuple[bool, str] | None:
        """None when delivered, else (worth retrying, why not)."""
        headers = self._headers
        if self.spec.secret is not None:
            stamp = int(time.time())
            sig = signature(self.spec.secret.get_secret_value(), stamp, body)
            headers = {**headers, SIGNATURE_HEADER: sig}
        try:
            async with asyncio.timeout(self.spec.timeout_s):
                request = self._client.build_request(
                    "POST", self.spec.url, content=body, headers=headers
                )
                # The body of the answer is never read: only its status matters.
                response = await self._client.send(request, stream=True)
                await response.aclose()
        except TimeoutError:
            return True, f"no answer within {self.spec.timeout_s:g} s"
        except httpx.HTTPError as exc:
            return True, f"{type(exc).__name__}: {redact(str(exc))}"
        status = response.status_code
        if 200 <= status < 300:
            return None
        return status == 429 or status >= 500, f"HTTP {status}"


__all__ = [
    "SIGNATURE_HEADER",
    "ProbeOutcome",
    "Webhook",
    "WebhookBusyError",
    "WebhookState",
    "signature",
]
