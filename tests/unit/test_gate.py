"""The ASGI gate in front of the routes, around a stand-in app that echoes the body."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from httpx import ASGITransport, AsyncClient
from starlette.types import Receive, Scope, Send

from app.api.errors import install_error_handlers
from app.api.gate import Gate, Gated, is_json, request_id
from app.api.models import EventsRequest, RecommendRequest
from app.core.metrics import ServiceMetrics
from app.core.outcomes import Outcome
from app.process.admission import Admission
from app.process.concurrency_limit import AdaptiveLimit
from app.process.loop_lag import LoopLag


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    message = await receive()
    body = message.get("body", b"")
    scope["state"]["outcome"] = Outcome.DEGRADED if b"degrade" in body else Outcome.OK
    scope["state"]["exhausted"] = b"out of time" in body
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _routes(admission: Admission, metrics: ServiceMetrics) -> dict[str, Gated]:
    events = Admission(AdaptiveLimit(1, 1, 1, max_latency_s=1.0), LoopLag(), max_queue_s=0.001)
    return {
        "/recommend": Gated(admission, RecommendRequest, metrics.observe_request),
        "/events": Gated(events, EventsRequest),
    }


def _client(
    admission: Admission, metrics: ServiceMetrics, body_timeout_s: float = 1.0
) -> AsyncClient:
    gate = Gate(
        echo,
        _routes(admission, metrics),
        metrics=metrics,
        max_body_bytes=1024,
        body_timeout_s=body_timeout_s,
    )
    return AsyncClient(transport=ASGITransport(app=gate), base_url="http://test")


def _admission(max_in_flight: int = 4) -> Admission:
    limit = AdaptiveLimit(max_in_flight, 1, max_in_flight, max_latency_s=1.0)
    return Admission(limit, LoopLag(), max_queue_s=0.02)


def _sample(metrics: ServiceMetrics, name: str, outcome: Outcome) -> float:
    value = metrics.registry.get_sample_value(name, {"outcome": outcome})
    return value or 0.0


def _count(metrics: ServiceMetrics, outcome: Outcome) -> float:
    return _sample(metrics, "recsys_requests_total", outcome)


def _timed(metrics: ServiceMetrics, outcome: Outcome) -> float:
    return _sample(metrics, "recsys_request_duration_seconds_count", outcome)


async def test_an_admitted_request_reaches_the_route_with_its_body() -> None:
    metrics = ServiceMetrics()
    async with _client(_admission(), metrics) as client:
        response = await client.post("/recommend", json={"user_id": "u1"})
    assert response.status_code == 200
    assert response.json() == {"user_id": "u1"}
    assert _count(metrics, Outcome.OK) == _timed(metrics, Outcome.OK) == 1


async def test_a_full_worker_refuses_with_503_retry_after_and_the_error_body() -> None:
    metrics = ServiceMetrics()
    admission = _admission(max_in_flight=1)
    await admission.enter()  # one request already in flight
    admission.limit.saturated = True  # and it has been full: no waiting in line
    async with _client(admission, metrics) as client:
        response = await client.post(
            "/recommend", json={"user_id": "u1"}, headers={"x-request-id": "abc"}
        )
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.headers["x-request-id"] == "abc"
    body = response.json()
    assert body["error"] == "overloaded"
    assert body["request_id"] == "abc"
    assert _count(metrics, Outcome.SHED) == _timed(metrics, Outcome.SHED) == 1
    assert admission.in_flight == 1


async def test_json_sent_as_text_is_refused_with_415() -> None:
    metrics = ServiceMetrics()
    async with _client(_admission(), metrics) as client:
        response = await client.post(
            "/recommend", content=b'{"user_id": "u1"}', headers={"content-type": "text/plain"}
        )
    assert response.status_code == 415
    assert response.json()["error"] == "unsupported_media_type"
    assert _count(metrics, Outcome.INVALID) == _timed(metrics, Outcome.INVALID) == 1


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_over_the_limit_is_refused_with_413_unread(chunked: bool) -> None:
    admission = _admission()
    payload = b'{"user_id": "' + b"x" * 2000 + b'"}'

    async def chunks() -> object:
        for start in range(0, len(payload), 100):
            yield payload[start : start + 100]

    async with _client(admission, ServiceMetrics()) as client:
        response = await client.post(
            "/recommend",
            content=chunks() if chunked else payload,  # type: ignore[arg-type]
            headers={"content-type": "application/json"},
        )
    assert response.status_code == 413
    assert response.json()["error"] == "body_too_large"
    assert admission.in_flight == 0


async def test_other_paths_pass_through_with_a_request_id() -> None:
    metrics = ServiceMetrics()
    async with _client(_admission(max_in_flight=1), metrics) as client:
        response = await client.post("/elsewhere", content=b"x")
    assert response.status_code == 200
    assert len(response.headers["x-request-id"]) == 32
    assert _count(metrics, Outcome.OK) == 0


@pytest.mark.parametrize(
    ("supplied", "kept"),
    [(b"req-1", True), (b"x" * 65, False), (b"bad\x7fid", False), (b"caf\xc3\xa9", False)],
)
def test_a_supplied_request_id_is_kept_only_when_sane(supplied: bytes, kept: bool) -> None:
    rid = request_id([(b"x-request-id", supplied)])
    assert (rid == supplied.decode(errors="replace")) is kept


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [
        (b"application/json", True),
        (b"application/json; charset=utf-8", True),
        (b"Application/JSON", True),
        (b"application/vnd.api+json", True),
        (b"text/plain", False),
        (b"application/x-www-form-urlencoded", False),
        # Two slashes: FastAPI's parser reads it as text/plain, so the gate does not pass it.
        (b"application/x/+json", False),
        (None, False),
    ],
)
def test_json_media_types(content_type: bytes | None, ok: bool) -> None:
    assert is_json(content_type) is ok


async def test_a_body_that_trickles_in_holds_no_slot_and_gets_a_408() -> None:
    admission = _admission(max_in_flight=1)
    metrics = ServiceMetrics()
    held: list[int] = []

    async def trickle() -> object:
        for byte in b'{"user_id": "u1"}':
            held.append(admission.in_flight)
            yield bytes([byte])
            await asyncio.sleep(0.02)

    async with _client(admission, metrics, body_timeout_s=0.1) as client:
        slow = await client.post(
            "/recommend",
            content=trickle(),  # type: ignore[arg-type]
            headers={"content-type": "application/json"},
        )
        fast = await client.post("/recommend", json={"user_id": "u2"})
    assert slow.status_code == 408
    assert slow.json()["error"] == "request_timeout"
    assert slow.headers["connection"] == "close"
    assert set(held) == {0}  # the slot was free all along for others
    assert fast.status_code == 200
    assert _count(metrics, Outcome.INVALID) == 1


async def test_only_whole_answers_teach_the_limit_their_service_time() -> None:
    admission = _admission()
    observed: list[float] = []
    admission.limit.observe = observed.append  # type: ignore[method-assign,assignment]
    async with _client(admission, ServiceMetrics()) as client:
        await client.post("/recommend", json={"user_id": "u1"})  # the echo answers: ok
        await client.post("/recommend", content=b"{}", headers={"content-type": "text/plain"})
        await client.post("/recommend", json={"user_id": "degrade"})  # a dependency's fault
    assert len(observed) == 1
    assert 0 <= observed[0] < 1.0
    assert admission.in_flight == 0


async def test_a_degraded_answer_that_ran_out_of_its_budget_teaches_the_limit_too() -> None:
    admission = _admission()
    observed: list[float] = []
    admission.limit.observe = observed.append  # type: ignore[method-assign,assignment]
    async with _client(admission, ServiceMetrics()) as client:
        # Degraded for want of time, not for a dependency: queueing in the worker.
        await client.post("/recommend", json={"user_id": "degrade, out of time"})
    assert len(observed) == 1


def _large_client(metrics: ServiceMetrics) -> AsyncClient:
    gate = Gate(
        echo,
        _routes(_admission(), metrics),
        metrics=metrics,
        max_body_bytes=1 << 20,
        body_timeout_s=1.0,
    )
    return AsyncClient(transport=ASGITransport(app=gate), base_url="http://test")


async def test_a_body_of_many_unknown_keys_is_refused_without_validating_it() -> None:
    body = {"user_id": "u1", **{f"key{i}": i for i in range(5000)}, "k" * 5000: 1}
    metrics = ServiceMetrics()
    async with _large_client(metrics) as client:
        response = await client.post("/recommend", json=body)
    assert response.status_code == 422
    answer = response.json()
    assert answer["error"] == "invalid_request"
    assert len(answer["fields"]) == 20
    assert answer["fields"][0] == {"field": "key0", "message": "Extra inputs are not permitted"}
    assert answer["message"].endswith("(and 4998 more)")
    assert _count(metrics, Outcome.INVALID) == 1


async def test_an_overlong_list_and_huge_keys_are_reported_short() -> None:
    body = {
        "user_id": "u1",
        "exclude_item_ids": [f"i{n}" for n in range(2000)],
        "context": {f"{'x' * 300}{n}": n for n in range(30)},
    }
    async with _large_client(ServiceMetrics()) as client:
        response = await client.post("/recommend", json=body)
    assert response.status_code == 422
    fields = response.json()["fields"]
    assert fields[0]["field"] == "exclude_item_ids"
    assert "at most 500 items" in fields[0]["message"]
    assert all(len(field["field"]) <= 64 for field in fields)
    assert fields[1]["field"].startswith("context.xxx")


async def test_a_large_body_with_a_few_problems_goes_on_to_validation() -> None:
    body = {"user_id": "u1", "exclude_item_ids": ["i" * 100] * 60, "typo": 1}
    async with _large_client(ServiceMetrics()) as client:
        response = await client.post("/recommend", json=body)
    assert response.status_code == 200  # the echo stands for the route, which validates


async def test_events_have_an_admission_of_their_own() -> None:
    # /recommend's slots stay free while every /events slot is taken.
    metrics = ServiceMetrics()
    routes = _routes(_admission(), metrics)
    gate = Gate(echo, routes, metrics, max_body_bytes=1024, body_timeout_s=1.0)
    await routes["/events"].admission.enter()  # the one /events slot is busy
    async with AsyncClient(transport=ASGITransport(app=gate), base_url="http://test") as client:
        refused = await client.post("/events", json={"events": []})
        served = await client.post("/recommend", json={"user_id": "u1"})
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert served.status_code == 200


async def test_a_large_events_body_of_unknown_keys_is_refused_with_the_first_ones() -> None:
    events = [{"event_id": str(n), **{f"x{k}": k for k in range(5)}} for n in range(400)]
    metrics = ServiceMetrics()
    async with _large_client(metrics) as client:
        response = await client.post("/events", json={"events": events})
    assert response.status_code == 422
    fields = [field["field"] for field in response.json()["fields"]]
    assert fields[:2] == ["events.0.x0", "events.0.x1"]
    assert len(fields) == 20


async def test_a_route_the_gate_serves_is_answered_there_or_passed_on_whole() -> None:
    """What the gate's own answer takes (/recommend's valid bodies) never reaches the app;
    what it declines reaches it with the body intact, and both are counted and let go."""
    metrics = ServiceMetrics()
    admission = _admission(max_in_flight=1)

    async def serve(scope: Scope, body: bytes, send: Send) -> int | None:
        if b"decline" in body:
            return None
        scope["state"]["outcome"] = Outcome.OK
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"served"})
        return 200

    routes = {
        "/recommend": Gated(admission, RecommendRequest, metrics.observe_request, serve=serve)
    }
    gate = Gate(echo, routes, metrics=metrics, max_body_bytes=1024, body_timeout_s=1.0)
    transport = ASGITransport(app=gate)
    async with AsyncClient(transport=transport, base_url="http://test") as client:
        served = await client.post("/recommend", json={"user_id": "u1"})
        declined = await client.post("/recommend", json={"user_id": "decline"})
    assert served.content == b"served"
    assert declined.json() == {"user_id": "decline"}
    assert served.headers["x-request-id"]
    assert _count(metrics, Outcome.OK) == 2
    assert admission.in_flight == 0


async def test_a_route_that_fails_answers_500_with_the_request_id_and_no_trace() -> None:
    app = FastAPI()

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a secret detail")

    install_error_handlers(app)
    app.add_middleware(
        Gate, routes={}, metrics=ServiceMetrics(), max_body_bytes=1024, body_timeout_s=1.0
    )
    transport = ASGITransport(app=app, raise_app_exceptions=False)
    async with AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get("/boom", headers={"x-request-id": "caller-7"})
    assert response.status_code == 500
    assert response.headers["x-request-id"] == "caller-7"
    assert response.json()["request_id"] == "caller-7"
    assert response.json()["error"] == "internal_error"
    assert "secret" not in response.text
