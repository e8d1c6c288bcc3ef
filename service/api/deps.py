"""What routes share: the per-app `Runtime` and the dependencies that hand its parts out.

The runtime is built by `create_app` (settings, metrics, hub) and completed by the lifespan
(detector, GPU workers, stream manager). Routes reach it through the dependencies below,
which answer 503 while the service is starting or stopping, so no route sees a half-built
runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, HTTPException, Request, status
from starlette.requests import HTTPConnection

from vdet.api.schemas import ResultEventEncoder
from vdet.config import Settings
from vdet.hub import ResultsHub
from vdet.metrics import Metrics
from vdet.pipeline.detector import Detector
from vdet.streams import StreamManager

if TYPE_CHECKING:  # imports torch: only where a GPU backend runs
    from vdet.gpu_workers import GpuPool


@dataclass
class Runtime:
    """Everything one app instance runs on. Set up and torn down by the app's lifespan."""

    settings: Settings
    metrics: Metrics
    hub: ResultsHub
    detector: Detector | None = None
    manager: StreamManager | None = None
    gpu: GpuPool | None = None
    class_names: tuple[str, ...] = ()
    sources_started: int = 0
    ready: bool = False
    encoder: ResultEventEncoder = field(default_factory=ResultEventEncoder)


def runtime_of(conn: HTTPConnection) -> Runtime:
    rt: Runtime = conn.app.state.runtime
    return rt


def get_runtime(request: Request) -> Runtime:
    return runtime_of(request)


def _not_ready() -> HTTPException:
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        detail="the service is starting or stopping; retry shortly",
        headers={"Retry-After": "1"},
    )


def get_manager(request: Request) -> StreamManager:
    rt = runtime_of(request)
    if not rt.ready or rt.manager is None:
        raise _not_ready()
    return rt.manager


def get_detector(request: Request) -> Detector:
    rt = runtime_of(request)
    if not rt.ready or rt.detector is None:
        raise _not_ready()
    return rt.detector


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
ManagerDep = Annotated[StreamManager, Depends(get_manager)]
DetectorDep = Annotated[Detector, Depends(get_detector)]
