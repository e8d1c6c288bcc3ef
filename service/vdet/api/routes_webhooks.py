"""Webhooks for operators: GET /v1/webhooks, each configured webhook and how its deliveries
fare (the `vdet_webhook_*` metrics' counts, plus the last success and the last error), and
POST /v1/webhooks/{id}/test, one test delivery now, answered with how it went."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from pydantic import BaseModel, Field

from vdet.api.deps import service_of
from vdet.api.schemas import ErrorOut
from vdet.notify.webhooks import Webhook, WebhookBusyError

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


class WebhookTestOut(BaseModel):
    delivered: bool = Field(description="Whether the endpoint answered 2xx.")
    error: str | None = Field(
        description="Why not: the HTTP status, no answer in time, or the connection error."
    )
    seconds: float = Field(description="How long the attempt took.")


def _webhooks(request: Request) -> list[Webhook]:
    notifier = service_of(request).notifier
    return [] if notifier is None else notifier.webhooks


_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No webhook has this id."}
}


@router.post(
    "/{webhook_id}/test",
    response_model=WebhookTestOut,
    summary="Send one test delivery now and say how it went",
    description='The body is `{"webhook": id, "test": true, "sent_time": <unix time>, '
    '"events": []}`, signed and with the webhook\'s headers like every delivery; one attempt, '
    "no retry, outside the queue and the delivery counts.",
    responses={
        **_NOT_FOUND,
        409: {"model": ErrorOut, "description": "A test of this webhook is under way."},
    },
)
async def send_test_delivery(webhook_id: str, request: Request) -> WebhookTestOut:
    for hook in _webhooks(request):
        if hook.spec.id == webhook_id:
            try:
                outcome = await hook.probe()
            except WebhookBusyError as exc:
                raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
            return WebhookTestOut(**vars(outcome))
    raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no webhook {webhook_id!r}")


@router.get("", response_model=WebhooksOut, summary="Webhooks and how their deliveries fare")
def list_webhooks(request: Request) -> WebhooksOut:
    hooks = _webhooks(request)
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
