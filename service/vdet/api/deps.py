"""What routes share: the app's `Runtime` (vdet.root) and the dependencies that hand its
parts out.

The runtime is made by `create_app` and started by the lifespan. Routes reach its streams
through the dependencies below, which answer 503 while the service is starting or stopping, so
no route sees a half-built runtime.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from starlette.requests import HTTPConnection

from vdet.root import Runtime, StreamService


def runtime_of(conn: HTTPConnection) -> Runtime:
    rt: Runtime = conn.app.state.runtime
    return rt


def get_runtime(request: Request) -> Runtime:
    return runtime_of(request)


def not_ready() -> HTTPException:
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        detail="the service is starting or stopping; retry shortly",
        headers={"Retry-After": "1"},
    )


def get_streams(request: Request) -> StreamService:
    rt = runtime_of(request)
    if not rt.ready or rt.streams is None:
        raise not_ready()
    return rt.streams


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
StreamsDep = Annotated[StreamService, Depends(get_streams)]
