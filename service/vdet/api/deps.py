"""What routes share: the app's `Service` (vdet.root) and the dependencies that hand its parts
out.

The service is built by `create_app` and started by the lifespan. Routes reach the streams
through the dependencies below, which answer 503 while the service is starting or stopping, so
no route sees a half-built service: `StreamsDep` for what the streams show, `ControlDep` for
changes to them (which, with a streams file, are also written down).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from starlette.requests import HTTPConnection

from vdet.config.streams import StreamSpec
from vdet.root import Service
from vdet.streams.service import StreamControl, StreamService, UnknownStreamError


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


def get_specs(request: Request) -> Callable[[str], StreamSpec]:
    """What a stream is asked to be, by id (UnknownStreamError: 404): from the streams of this
    server, or in a fleet from the fleet's desired state, so that any node edits any stream."""
    service = service_of(request)
    streams = get_streams_of(service)
    fleet = service.fleet
    if fleet is None:
        return lambda stream_id: streams.get(stream_id).spec

    def desired(stream_id: str) -> StreamSpec:
        spec = fleet.spec(stream_id)
        if spec is None:
            raise UnknownStreamError(f"no stream {stream_id!r}")
        return spec

    return desired


ServiceDep = Annotated[Service, Depends(get_service)]
StreamsDep = Annotated[StreamService, Depends(get_streams)]
ControlDep = Annotated[StreamControl, Depends(get_control)]
SpecsDep = Annotated[Callable[[str], StreamSpec], Depends(get_specs)]
