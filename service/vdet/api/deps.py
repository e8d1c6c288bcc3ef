"""What routes share: the app's `Service` (vdet.root) and the dependencies that hand its parts
out.

The service is built by `create_app` and started by the lifespan. Routes reach the streams
through the dependencies below, which answer 503 while the service is starting or stopping, so
no route sees a half-built service: `StreamsDep` for what the streams show, `ControlDep` for
changes to them (which, with a streams file, are also written down).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from starlette.requests import HTTPConnection

from vdet.root import Service
from vdet.streams.service import StreamControl, StreamService


def service_of(conn: HTTPConnection) -> Service:
    service: Service = conn.app.state.service
    return service


def get_service(request: Request) -> Service:
    return service_of(request)


def not_ready() -> HTTPException:
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        detail="the service is starting or stopping; retry shortly",
        headers={"Retry-After": "1"},
    )


def get_streams(request: Request) -> StreamService:
    return get_streams_of(service_of(request))


def get_streams_of(service: Service) -> StreamService:
    """The service's streams; 503 while it starts or stops."""
    streams = service.streams
    if not service.ready or streams is None:
        raise not_ready()
    return streams


def get_control(request: Request) -> StreamControl:
    service = service_of(request)
    control = service.control
    if not service.ready or control is None:
        raise not_ready()
    return control


ServiceDep = Annotated[Service, Depends(get_service)]
StreamsDep = Annotated[StreamService, Depends(get_streams)]
ControlDep = Annotated[StreamControl, Depends(get_control)]
