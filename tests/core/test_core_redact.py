"""Credentials out of text: userinfo and secret query parameters, wherever a URL appears."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from vdet.core.redact import DEFAULT_SECRET_PARAMS, is_secret_param, redact, use_secret_params


@pytest.fixture(autouse=True)
def defaults() -> Iterator[None]:
    use_secret_params(DEFAULT_SECRET_PARAMS)
    yield
    use_secret_params(DEFAULT_SECRET_PARAMS)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("rtsp://u:p@cam/s", "rtsp://***@cam/s"),
        ("rtsp://u:p@ss@cam/s?token=abc&x=1", "rtsp://***@cam/s?token=***&x=1"),
        (
            "http://cam/v.cgi?user=admin&password=s3cr%40t#f",
            "http://cam/v.cgi?user=admin&password=***#f",
        ),
        (
            "GET /a?X-Amz-Signature=beef&X-Amz-Date=1 failed",
            "GET /a?X-Amz-Signature=***&X-Amz-Date=1 failed",
        ),
        (
            'open "http://h/x?pass%77ord=1;api_key=zz"',
            'open "http://h/x?pass%77ord=***;api_key=***"',
        ),
        ("http://h/?PWD=1&Access_Token=2&sid=3", "http://h/?PWD=***&Access_Token=***&sid=***"),
        ("http://h/?keyframe=1&author=me&monkey=2", "http://h/?keyframe=1&author=me&monkey=2"),
        ("rtsp://h/s?pwd=&channel=1", "rtsp://h/s?pwd=&channel=1"),
        ("a=b and key=c", "a=b and key=c"),  # not a query string
        ("x ?key=1\n&secret=2", "x ?key=***\n&secret=***"),
    ],
)
def test_userinfo_and_secret_parameters_are_hidden(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_the_secret_names_are_a_setting() -> None:
    use_secret_params(["camkey"])
    assert redact("http://h/?camkey=1&password=2") == "http://h/?camkey=***&password=2"
    assert is_secret_param("CAMKEY") and is_secret_param("x-camkey")
    assert not is_secret_param("token")
