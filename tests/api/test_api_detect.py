"""POST /v1/detect: formats, multipart and raw bodies, size limits, query parameters."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import cv2
import numpy as np
import pytest
from support.apptest import MakeSettings, TestClient, expected_box
from support.crafted_images import png_claiming

from vdet.api.app import create_app

WH = (160, 120)


def encoded(ext: str, wh: tuple[int, int] = WH) -> bytes:
    image = np.full((wh[1], wh[0], 3), 90, np.uint8)
    cv2.circle(image, (wh[0] // 2, wh[1] // 2), 20, (0, 0, 255), -1)
    ok, buf = cv2.imencode(ext, image)
    assert ok
    return buf.tobytes()


def names(body: dict[str, object]) -> list[str]:
    dets = body["detections"]
    assert isinstance(dets, list)
    return [d["class_name"] for d in dets]


@pytest.mark.parametrize(
    ("ext", "media_type"),
    [(".jpg", "image/jpeg"), (".png", "image/png"), (".bmp", "image/bmp"), (".webp", "image/webp")],
)
def test_raw_image_body(client: TestClient, ext: str, media_type: str) -> None:
    r = client.post("/v1/detect", content=encoded(ext), headers={"content-type": media_type})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["image_width"], body["image_height"]) == WH
    assert names(body) == ["person", "car", "dog"]
    assert body["detections"][0]["box"] == pytest.approx(expected_box(0, WH), abs=1e-3)
    assert body["timings_ms"]["end_to_end"] >= body["timings_ms"]["inference"]


def test_multipart_upload(client: TestClient) -> None:
    files = {"file": ("frame.png", encoded(".png"), "image/png")}
    r = client.post("/v1/detect", files=files)
    assert r.status_code == 200, r.text
    assert names(r.json()) == ["person", "car", "dog"]


def test_format_is_recognised_by_content_not_declared_type(client: TestClient) -> None:
    r = client.post(
        "/v1/detect", content=encoded(".png"), headers={"content-type": "application/octet-stream"}
    )
    assert r.status_code == 200
    r = client.post("/v1/detect", content=encoded(".png"), headers={"content-type": "image/jpeg"})
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("conf=0.5", ["person", "car"]),
        ("conf=0.95", []),
        ("classes=dog,car", ["car", "dog"]),
        ("classes=dog&classes=0", ["person", "dog"]),
        ("classes=1", ["car"]),
        ("max_det=1", ["person"]),
        ("iou=0.1&conf=0.2", ["person", "car", "dog"]),
    ],
)
def test_query_parameters(client: TestClient, query: str, expected: list[str]) -> None:
    r = client.post(
        f"/v1/detect?{query}", content=encoded(".jpg"), headers={"content-type": "image/jpeg"}
    )
    assert r.status_code == 200, r.text
    assert names(r.json()) == expected


@pytest.mark.parametrize(
    "query", ["conf=2", "conf=abc", "iou=-0.1", "max_det=0", "classes=unicorn", "classes=9"]
)
def test_invalid_query_is_422(client: TestClient, query: str) -> None:
    r = client.post(
        f"/v1/detect?{query}", content=encoded(".jpg"), headers={"content-type": "image/jpeg"}
    )
    assert r.status_code == 422
    assert "detail" in r.json()


@pytest.mark.parametrize(
    ("content", "media_type"),
    [
        (b"definitely not an image", "image/jpeg"),
        (b"", "image/png"),
        (b"GIF89a" + b"\0" * 64, "image/gif"),
        (encoded(".jpg")[:200], "image/jpeg"),  # truncated
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 100, "image/png"),  # header only
        (b'{"image": "x"}', "application/json"),
        (b"hello", "text/plain"),
    ],
)
def test_non_images_are_415(client: TestClient, content: bytes, media_type: str) -> None:
    r = client.post("/v1/detect", content=content, headers={"content-type": media_type})
    assert r.status_code == 415, r.text
    assert "detail" in r.json()


def test_multipart_with_a_non_image_is_415(client: TestClient) -> None:
    r = client.post("/v1/detect", files={"file": ("x.txt", b"plain text", "text/plain")})
    assert r.status_code == 415


def test_multipart_without_a_file_part_is_422(client: TestClient) -> None:
    r = client.post("/v1/detect", data={"note": "no file"}, files={"other": ("x", b"1")})
    assert r.status_code == 422
    assert "'file'" in r.json()["detail"]


def test_image_with_too_many_pixels_is_refused_before_decoding(client: TestClient) -> None:
    # A PNG header claiming 20000 x 20000 (400 MP): refused from the header alone.
    r = client.post(
        "/v1/detect", content=png_claiming(20000, 20000), headers={"content-type": "image/png"}
    )
    assert r.status_code == 415
    assert "pixels" in r.json()["detail"]


@pytest.fixture
def small_limit_client(make_settings: MakeSettings) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(max_upload_bytes=4096))) as c:
        yield c


def test_declared_content_length_over_the_limit_is_413(small_limit_client: TestClient) -> None:
    big = encoded(".png", (400, 300)) + b"\0" * 10_000
    r = small_limit_client.post("/v1/detect", content=big, headers={"content-type": "image/png"})
    assert r.status_code == 413
    assert "4096" in r.json()["detail"]
    files = {"file": ("big.png", big, "image/png")}
    assert small_limit_client.post("/v1/detect", files=files).status_code == 413


async def asgi_post(
    app: Any, headers: list[tuple[bytes, bytes]], chunks: list[bytes]
) -> tuple[int, bytes, int]:
    """POST /v1/detect straight to the ASGI app; returns (status, body, chunks it read).

    TestClient buffers the whole request body before the app sees it; this shows what the
    app itself reads.
    """
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read < len(chunks):
            read += 1
            return {"type": "http.request", "body": chunks[read - 1], "more_body": True}
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/detect",
        "raw_path": b"/v1/detect",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
        "app": app,
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body, read


def test_body_over_the_limit_is_refused_without_reading_it(
    small_limit_client: TestClient,
) -> None:
    app = small_limit_client.app
    chunks = [b"\xff\xd8\xff" + b"\0" * 1021] + [b"\0" * 1024] * 99  # 100 KiB

    async def run() -> None:
        # Declared too large: refused before a single byte is read.
        declared = [(b"content-type", b"image/jpeg"), (b"content-length", b"102400")]
        status, body, read = await asgi_post(app, declared, chunks)
        assert (status, read) == (413, 0)
        assert b"4096" in body
        # Chunked (no Content-Length): cut off as soon as the running count passes the limit.
        status, _, read = await asgi_post(app, [(b"content-type", b"image/jpeg")], chunks)
        assert status == 413
        assert read == 5
        multipart = [(b"content-type", b"multipart/form-data; boundary=xyz")]
        part = (
            b"--xyz\r\nContent-Disposition: form-data; name=file; filename=a.jpg\r\n"
            b"Content-Type: image/jpeg\r\n\r\n"
        )
        status, _, read = await asgi_post(app, multipart, [part, *chunks])
        assert status == 413
        assert read <= 6

    asyncio.run(run())


def test_small_upload_within_limit_is_fine(small_limit_client: TestClient) -> None:
    body = encoded(".jpg", (32, 32))
    assert len(body) < 4096
    r = small_limit_client.post("/v1/detect", content=body, headers={"content-type": "image/jpeg"})
    assert r.status_code == 200


def test_invalid_content_length_is_400(client: TestClient) -> None:
    r = client.post(
        "/v1/detect",
        content=encoded(".jpg"),
        headers={"content-type": "image/jpeg", "content-length": "lots"},
    )
    assert r.status_code == 400
    assert r.json() == {"detail": "invalid Content-Length header"}


@pytest.mark.parametrize("ext", [".jpg", ".png"])
def test_a_large_upload_is_answered_in_its_own_pixels(client: TestClient, ext: str) -> None:
    """Decoded reduced to about the model's input, detected there; the boxes come back in
    the upload's pixels."""
    wh = (2560, 1920)
    r = client.post("/v1/detect", content=encoded(ext, wh))
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["image_width"], body["image_height"]) == wh
    # Within a reduced pixel's rounding of the letterbox (the reduction is 2560 / 640 = 4 at
    # most here, 4 upload pixels of a letterbox pad).
    assert body["detections"][0]["box"] == pytest.approx(expected_box(0, wh), abs=8.0)
