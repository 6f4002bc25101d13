"""The HTTP contract: what the API accepts, refuses, and says about itself."""

from __future__ import annotations

import re
from typing import Any

import pytest
from httpx import AsyncClient
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import CONTEXT, Stack, serving

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def _fields(response: Any) -> list[str]:
    return [f["field"] for f in response.json()["fields"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "user_id"),
        ({"user_id": ""}, "user_id"),
        ({"user_id": 42}, "user_id"),
        ({"user_id": "u1", "num_items": 0}, "num_items"),
        ({"user_id": "u1", "num_items": 201}, "num_items"),
        ({"user_id": "u1", "num_items": "5"}, "num_items"),
        ({"user_id": "u1", "num_items": 5.0}, "num_items"),
        ({"user_id": "u1", "num_items": True}, "num_items"),
        ({"user_id": "u1", "exclude_item_ids": ["i1"] * 501}, "exclude_item_ids"),
        ({"user_id": "u1", "exclude_item_ids": "i1"}, "exclude_item_ids"),
        ({"user_id": "u1", "context": {"hour": 24}}, "context.hour"),
        ({"user_id": "u1", "context": {"hour": "10"}}, "context.hour"),
        ({"user_id": "u1", "context": {"colour": "red"}}, "context.colour"),
        ({"user_id": "u1", "debug": "true"}, "debug"),
        ({"user_id": "u1", "debug": 1}, "debug"),
        ({"user_id": "u1", "numitems": 3}, "numitems"),
        ([1, 2], "body"),
    ],
)
async def test_invalid_bodies_name_the_field(client: AsyncClient, body: object, field: str) -> None:
    response = await client.post("/recommend", json=body, headers={"x-request-id": "bad-1"})
    assert response.status_code == 422
    error = response.json()
    assert error["error"] == "invalid_request"
    assert field in _fields(response)
    assert error["request_id"] == "bad-1"
    assert "Traceback" not in response.text


async def test_a_lone_surrogate_is_refused_not_a_server_error(client: AsyncClient) -> None:
    response = await client.post(
        "/recommend",
        content=b'{"user_id": "\\ud800"}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422
    assert _fields(response) == ["user_id"]


async def test_an_unparseable_body_is_a_400_naming_the_body(client: AsyncClient) -> None:
    response = await client.post(
        "/recommend", content=b'{"user_id": ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_json"
    assert _fields(response) == ["body"]


async def test_json_sent_as_text_is_a_415(client: AsyncClient) -> None:
    response = await client.post(
        "/recommend", content=b'{"user_id": "u1"}', headers={"content-type": "text/plain"}
    )
    assert response.status_code == 415
    assert response.json()["error"] == "unsupported_media_type"


async def test_a_huge_body_is_a_413_without_being_parsed(client: AsyncClient) -> None:
    body = b'{"user_id": "u1", "exclude_item_ids": ["' + b"x" * (20 << 20) + b'"]}'
    response = await client.post(
        "/recommend", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"] == "body_too_large"


async def test_long_lists_of_errors_are_cut_short(client: AsyncClient) -> None:
    response = await client.post(
        "/recommend", json={"user_id": "u1", "exclude_item_ids": [""] * 500}
    )
    assert response.status_code == 422
    assert len(response.json()["fields"]) == 20
    assert len(response.content) < 5_000


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [("GET", "/nowhere", 404, "not_found"), ("GET", "/recommend", 405, "method_not_allowed")],
)
async def test_unknown_paths_and_methods_get_the_same_error_shape(
    client: AsyncClient, method: str, path: str, status: int, code: str
) -> None:
    response = await client.request(method, path, headers={"x-request-id": "r-404"})
    assert response.status_code == status
    assert response.json() == {
        "error": code,
        "message": response.json()["message"],
        "fields": [],
        "request_id": "r-404",
    }
    assert response.headers["x-request-id"] == "r-404"
    if status == 405:
        assert response.headers["allow"] == "POST"


async def test_the_request_id_is_echoed_or_made(client: AsyncClient) -> None:
    echoed = await client.post(
        "/recommend", json={"user_id": "u1", "context": CONTEXT}, headers={"x-request-id": "abc"}
    )
    assert echoed.json()["request_id"] == echoed.headers["x-request-id"] == "abc"
    made = await client.post(
        "/recommend", json={"user_id": "u1"}, headers={"x-request-id": "bad id\x7f"}
    )
    assert re.fullmatch(r"[0-9a-f]{32}", made.json()["request_id"])


@pytest.mark.parametrize("value", [b"soon", b"0", b"-5", b"1.5", "²".encode()])
async def test_a_bad_budget_header_names_the_header(client: AsyncClient, value: bytes) -> None:
    response = await client.post(
        "/recommend", json={"user_id": "u1"}, headers={b"x-request-timeout-ms": value}
    )
    assert response.status_code == 422
    assert _fields(response) == ["header.x-request-timeout-ms"]


async def test_a_tighter_budget_is_honoured(client: AsyncClient) -> None:
    response = await client.post(
        "/recommend", json={"user_id": "u1"}, headers={"x-request-timeout-ms": "1"}
    )
    # Raised to the configured minimum, 20 ms: enough to answer, degraded or not.
    assert response.status_code == 200
    assert len(response.json()["items"]) == 20


async def test_every_outcome_is_counted_and_timed(client: AsyncClient) -> None:
    await client.post("/recommend", json={"user_id": "u1", "num_items": "x"})
    await client.post("/recommend", content=b"x", headers={"content-type": "text/plain"})
    text = (await client.get("/metrics")).text
    samples = {
        (s.name, s.labels.get("outcome")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    for name in ("recsys_requests_total", "recsys_request_duration_seconds_count"):
        assert samples[name, "invalid"] >= 2


async def test_the_openapi_document_lists_every_status(client: AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    recommend = document["paths"]["/recommend"]["post"]
    assert set(recommend["responses"]) == {
        "200", "400", "404", "405", "408", "413", "415", "422", "500", "503"
    }  # fmt: skip
    assert "Retry-After" in recommend["responses"]["503"]["headers"]
    parameters = {p["name"].lower() for p in recommend["parameters"]}
    assert parameters == {"x-request-timeout-ms", "x-request-id", "x-recsys-trace"}
    metrics = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    hour = document["components"]["schemas"]["ClientContext"]["properties"]["hour"]
    assert "UTC" in hour["description"]


async def test_docs_load_nothing_from_elsewhere(client: AsyncClient) -> None:
    page = (await client.get("/docs")).text
    assets = re.findall(r"""(?:src|href)=['"]([^'"]+)""", page)
    assert assets
    assert all(asset.startswith("/") for asset in assets), assets
    for asset in assets:
        if "static" in asset:
            assert (await client.get(asset)).status_code == 200


async def test_docs_can_be_turned_off(stack: Stack) -> None:
    async with serving(stack.settings(docs=False)) as api:
        assert (await api.get("/docs")).status_code == 404
        assert (await api.get("/openapi.json")).status_code == 200
