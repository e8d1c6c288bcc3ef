"""Schemathesis against the OpenAPI description: generated requests for every operation, on
a budget, must never get a server error nor an answer that contradicts the schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from openapi_spec_validator import validate
from schemathesis.checks import not_a_server_error, response_schema_conformance
from support.apptest import MakeSettings, TestClient

from vdet.api.app import create_app

EXAMPLES_PER_OPERATION = 25


@pytest.fixture
def app(make_settings: MakeSettings) -> Iterator[Any]:
    app = create_app(make_settings(max_streams=4))
    with TestClient(app):  # runs the lifespan: the detector and the stream manager are up
        yield app


def test_generated_requests_get_no_server_error_and_match_the_schema(app: Any) -> None:
    # Driven by hand rather than by schemathesis's pytest plugin, which needs a pytest
    # internal (`Function._nodeid`) that this pytest no longer has.
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    calls = 0

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def check(case: Any) -> None:
            nonlocal calls
            calls += 1
            case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])

        check()
    assert calls >= 5 * len(operations)


def test_the_document_is_valid_openapi_3_1_and_says_what_the_guard_answers(
    client: TestClient,
) -> None:
    document = client.get("/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    validate(document)  # the OpenAPI 3.1 schema, JSON Schema 2020-12 for the models
    for path, item in document["paths"].items():
        for method, operation in item.items():
            answers = operation["responses"]
            assert "431" in answers, (method, path)
            if "requestBody" in operation:
                assert {"408", "413", "422"} <= answers.keys(), (method, path)


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/v1/streams", "GET, OPTIONS, POST"),
        ("/v1/streams/cam", "DELETE, GET, OPTIONS, PATCH"),
        ("/v1/streams/cam/zones", "DELETE, GET, OPTIONS, PUT"),
        ("/healthz", "GET, OPTIONS"),
    ],
)
def test_options_says_every_method_of_a_url_and_so_does_a_405(
    client: TestClient, path: str, methods: str
) -> None:
    r = client.options(path)
    assert (r.status_code, r.headers["allow"], r.content) == (204, methods, b"")
    r = client.request("TRACE", path)
    assert (r.status_code, r.headers["allow"]) == (405, methods)
    assert client.options("/v1/nothing-here").status_code == 404
