"""GET /v1/webhooks: each configured webhook and how its deliveries fare, for operators (the
same counts as the `vdet_webhook_*` metrics, plus the last success and the last error)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from vdet.api.webhooks import Notifier

router = APIRouter(prefix="/v1/webhooks", tags=["ops"])


class WebhookOut(BaseModel):
    id: str
    url: str = Field(description="Where it POSTs, credentials shown as ***.")
    events: list[str] | None = Field(description="Event types it gets; null: all.")
    streams: list[str] | None = Field(description="Streams it hears of; null: all.")
    zones: list[str] | None = Field(description="Zones and lines it hears of; null: all.")
    classes: list[str] | None = Field(description="Classes it hears of; null: all.")
    signed: bool = Field(description="Whether its bodies carry X-Vdet-Signature.")
    pending: int = Field(description="Deliveries waiting now (and the one being sent).")
    delivered: int = Field(description="Deliveries answered with 2xx since the start.")
    failed: int = Field(description="Deliveries given up: a 4xx or redirect, or out of attempts.")
    dropped: int = Field(description="Deliveries dropped: its queue was full, or shutdown came.")
    retries: int = Field(description="Attempts made again.")
    last_delivered_time: float | None = Field(description="Unix time of the last 2xx.")
    last_error: str | None = Field(
        description="Why the last attempt that did not succeed failed (HTTP status, timeout, "
        "connection error); kept after later successes, see last_error_time."
    )
    last_error_time: float | None = None


class WebhooksOut(BaseModel):
    webhooks: list[WebhookOut] = Field(description="In configuration order; empty: none set.")


@router.get("", response_model=WebhooksOut, summary="Webhooks and how their deliveries fare")
def list_webhooks(request: Request) -> WebhooksOut:
    notifier: Notifier | None = getattr(request.app.state, "notifier", None)
    hooks = [] if notifier is None else notifier.webhooks
    return WebhooksOut(
        webhooks=[
            WebhookOut(
                id=hook.spec.id,
                url=hook.where,
                events=None if hook.spec.events is None else list(hook.spec.events),
                streams=hook.spec.streams,
                zones=hook.spec.zones,
                classes=hook.spec.classes,
                signed=hook.spec.secret is not None,
                pending=hook.pending,
                **vars(hook.state),
            )
            for hook in hooks
        ]
    )
