"""The operator's web page: `/` and its few static files (package data in vdet/web/).

The page is plain HTML, CSS and one JavaScript file, served as they are: no build step, no
framework. It is public (it holds no data); everything it shows comes from the API with the
key the operator types in, sent in headers (never in URLs). This module only serves files.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)

_MEDIA_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
# Only our own files; frames are drawn from blobs (createImageBitmap), the feeds are ws(s).
_CSP = (
    "default-src 'self'; img-src 'self' data: blob:; connect-src 'self' ws: wss:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
)


def _read(name: str) -> bytes:
    return (resources.files("vdet") / "web" / name).read_bytes()


def _file(name: str) -> Response:
    if name not in _MEDIA_TYPES:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no file {name!r}")
    return Response(
        _read(name),
        media_type=_MEDIA_TYPES[name],
        headers={
            # Small files; revalidating each load keeps a new version from hiding behind a cache.
            "Cache-Control": "no-cache",
            "Content-Security-Policy": _CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )


@router.get("/")
def index() -> Response:
    return _file("index.html")


@router.get("/ui/{name}")
def static_file(name: str) -> Response:
    return _file(name)
