"""Who may post events, against real Redis and a real consumer: callers with their own
tokens, quotas, answer ids only the service issues, and user ids that can tag their keys."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from pydantic import SecretStr
from recsys_tools.localstack import ManagedProcess, start_ingest

from app.core.callers import entry
from app.core.errors import ConfigError
from app.core.settings import load_settings
from app.main import create_app
from loadtest.service import start_api
from tests.integration.conftest import CONTEXT, Stack, metric_samples
from tests.integration.test_realtime import (
    APPLIED_WITHIN_S,
    KEYS,
    PARTITIONS,
    _drained,
    _event,
    _events_stored,
    _ingest_settings,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
SHOP = "shop-token-000000000000000000000000"
APP = "app-token-0000000000000000000000000"
ELSEWHERE = ("203.0.113.7", 51000)


@asynccontextmanager
async def _api(
    settings: Any, client: tuple[str, int] = ELSEWHERE
) -> AsyncIterator[httpx.AsyncClient]:
    """The app as a client at `client` reaches it (not loopback, by default)."""
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app, client=client)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://recsys.test") as api,
    ):
        yield api


def _as(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _callers() -> SecretStr:
    return SecretStr(f"{entry('shop', SHOP)},{entry('app', APP)}")


async def test_only_named_callers_post_events_within_their_quota(
    stack: Stack, own_redis: tuple[ManagedProcess, str]
) -> None:
    url = own_redis[1]
    settings = stack.settings(
        redis_url=url,
        event_partitions=PARTITIONS,
        event_callers=_callers(),
        event_caller_rate=10.0,
        event_caller_burst=500,
    )
    batch = {"events": [_event(n, f"u{n}", "i1") for n in range(300)]}
    async with _api(settings) as api:
        assert (await api.post("/events", json=batch)).status_code == 401
        wrong = await api.post("/events", json=batch, headers=_as("not-a-caller-token-at-all"))
        assert wrong.status_code == 401
        assert wrong.headers["www-authenticate"] == "Bearer"
        assert wrong.json()["error"] == "unauthenticated"
        first = await api.post("/events", json=batch, headers=_as(SHOP))
        assert first.status_code == 202, first.text
        # 300 of the 500 burst taken; 300 more is over the shop's quota, not the app's.
        over = await api.post("/events", json=batch, headers=_as(SHOP))
        assert over.status_code == 429
        assert over.json()["error"] == "over_quota"
        assert int(over.headers["retry-after"]) >= 1
        other = await api.post("/events", json=batch, headers=_as(APP))
        assert other.status_code == 202
        # The recommend route stays open to everyone who reaches it.
        body = {"user_id": "u3", "context": CONTEXT}
        assert (await api.post("/recommend", json=body)).status_code == 200
        samples = metric_samples((await api.get("/metrics")).text)
    assert samples["recsys_event_posts_total{caller=shop,outcome=accepted}"] == 1
    assert samples["recsys_event_posts_total{caller=shop,outcome=over_quota}"] == 1
    assert samples["recsys_event_posts_total{caller=app,outcome=accepted}"] == 1
    assert samples["recsys_event_posts_total{caller=unknown,outcome=unauthenticated}"] == 2
    client = redis.Redis.from_url(url)
    try:
        assert _events_stored(client) == 600  # the two accepted batches, nothing else
    finally:
        client.close()


async def test_with_no_callers_configured_events_come_from_loopback_only(
    stack: Stack, own_redis: tuple[ManagedProcess, str]
) -> None:
    settings = stack.settings(redis_url=own_redis[1], event_partitions=PARTITIONS)
    events = {"events": [_event(1, "u1", "i1")]}
    async with _api(settings) as away:
        refused = await away.post("/events", json=events, headers=_as(SHOP))
        assert refused.status_code == 403
        assert refused.json()["error"] == "forbidden"
    async with _api(settings, client=("127.0.0.1", 51000)) as local:
        assert (await local.post("/events", json=events)).status_code == 202


@pytest.mark.parametrize("trusted_proxies", ["", "127.0.0.1"])
async def test_a_request_a_proxy_forwarded_is_never_loopback_on_a_real_server(
    stack: Stack, own_redis: tuple[ManagedProcess, str], tmp_path: Path, trusted_proxies: str
) -> None:
    """uvicorn itself, as the service starts it: with the proxy trusted it takes the client
    from X-Forwarded-For (the access log shows it), without it the socket's peer; either
    way a request that came through a proxy on this host is not a loopback caller, even one
    that names 127.0.0.1 as its client."""
    env = {
        "RECSYS_REDIS_URL": own_redis[1],
        "RECSYS_TRITON_URL": stack.triton_url,
        "RECSYS_ARTIFACTS_DIR": str(stack.world),
        "RECSYS_EVENT_PARTITIONS": str(PARTITIONS),
        "RECSYS_TRUSTED_PROXIES": trusted_proxies,
    }
    log = tmp_path / "api.log"
    api = await asyncio.to_thread(start_api, env, log, ["--access-log", "--log-level", "info"])
    events = {"events": [_event(1, "u1", "i1")]}
    try:
        async with httpx.AsyncClient(base_url=api.url, timeout=10.0) as client:
            assert (await client.post("/events", json=events)).status_code == 202
            for forwarded in ("127.0.0.1", "203.0.113.7"):
                refused = await client.post(
                    "/events", json=events, headers={"x-forwarded-for": forwarded}
                )
                assert refused.status_code == 403, (forwarded, refused.text)
    finally:
        await asyncio.to_thread(api.stop)
    lines = [line for line in log.read_text().splitlines() if "POST /events" in line]
    assert len(lines) == 3, lines
    outsider = lines[2]
    if trusted_proxies:
        assert "203.0.113.7" in outsider, outsider
    else:
        assert "203.0.113.7" not in outsider, outsider
        assert "127.0.0.1" in outsider, outsider


async def test_a_user_id_that_cannot_tag_its_keys_is_refused(
    stack: Stack, own_redis: tuple[ManagedProcess, str]
) -> None:
    settings = stack.settings(redis_url=own_redis[1], event_partitions=PARTITIONS)
    async with _api(settings, client=("127.0.0.1", 51000)) as api:
        for user in ("}x", "a{b", "{u1}"):
            posted = await api.post("/events", json={"events": [_event(1, user, "i1")]})
            assert posted.status_code == 422, user
            assert posted.json()["fields"][0]["field"] == "events.0.user_id"
            asked = await api.post("/recommend", json={"user_id": user})
            assert asked.status_code == 422
            assert asked.json()["fields"][0]["field"] == "user_id"


async def test_only_an_answer_the_service_gave_is_credited(
    stack: Stack, own_redis: tuple[ManagedProcess, str], tmp_path: Path
) -> None:
    url = own_redis[1]
    consumer = start_ingest(_ingest_settings(stack, url), tmp_path / "ingest", metrics=True)
    try:
        await _credits_only_what_was_given(stack, url, consumer.ports["metrics"])
    finally:
        consumer.stop()


async def _credits_only_what_was_given(stack: Stack, url: str, port: int) -> None:
    settings = stack.settings(redis_url=url, event_partitions=PARTITIONS)
    now_ms = int(time.time() * 1000)
    async with _api(settings, client=("127.0.0.1", 51000)) as api:
        given = await api.post(
            "/recommend",
            json={"user_id": "u7", "context": CONTEXT},
            headers={"x-request-id": "client-chosen-id"},
        )
        answer = given.json()
        await _noted(url, answer["answer_id"])  # written off the request path, as a click is later
        assert answer["request_id"] == "client-chosen-id"
        assert answer["answer_id"] != "client-chosen-id"
        # A client that names its own request id as the answer cannot credit it, nor can a
        # well-formed id the service never issued; the real one credits once.
        item = answer["items"][0]["item_id"]
        events = [
            _event(1, "u7", item, answer_id="client-chosen-id"),
            _event(2, "u7", answer["items"][1]["item_id"], answer_id="0" * 32),
            _event(3, "u7", answer["items"][2]["item_id"], answer_id=answer["answer_id"]),
            _event(4, "u7", answer["items"][3]["item_id"], ts=now_ms - 30 * 86_400_000),
        ]
        posted = (await api.post("/events", json={"events": events})).json()
        assert posted["accepted"] == 3
        assert posted["uncredited"] == 1
        assert posted["stale"] == [3]
        # Another answer with the same client request id leaves the first answer's note.
        again = await api.post(
            "/recommend",
            json={"user_id": "u8", "context": CONTEXT},
            headers={"x-request-id": "client-chosen-id"},
        )
        assert again.json()["answer_id"] != answer["answer_id"]
        _drained(url)
    client = redis.Redis.from_url(url)
    try:
        assert client.get(KEYS.answer("client-chosen-id")) is None
        assert client.get(KEYS.answer(answer["answer_id"])) == b"stable"
    finally:
        client.close()
    give_up = time.monotonic() + APPLIED_WITHIN_S
    while True:
        scraped = await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{port}/metrics")
        said = metric_samples(scraped.text)
        if said.get("recsys_ingest_credits_total{result=unknown}") == 1:
            break
        assert time.monotonic() < give_up, {k: v for k, v in said.items() if "credit" in k}
        await asyncio.sleep(0.1)
    assert said["recsys_ingest_credits_total{result=credited}"] == 1
    assert said["recsys_outcomes_total{type=click,variant=stable}"] == 1


async def _noted(url: str, answer_id: str) -> None:
    """Once the answer's note is written: by a task of the app's, on this event loop."""
    client = redis.Redis.from_url(url)
    try:
        give_up = time.monotonic() + APPLIED_WITHIN_S
        while client.get(KEYS.answer(answer_id)) is None:
            assert time.monotonic() < give_up, "the answer's note was never written"
            await asyncio.sleep(0.01)
    finally:
        client.close()


@pytest.mark.asyncio(loop_scope="session")
async def test_the_callers_list_is_checked_at_start() -> None:
    for bad in ("shop=plain-token", "loopback=sha256:" + "0" * 64, "a=sha256:00"):
        with pytest.raises(ConfigError, match="RECSYS_EVENT_CALLERS"):
            load_settings(event_callers=bad)
