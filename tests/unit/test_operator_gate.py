"""The operator's routes behind the gate, as the app builds them: who is calling is decided
before a byte of the body is read, and a body past the route's limit is refused after no
more than that limit is read. Nothing here starts the service: the gate answers first."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr
from starlette.types import Message

from app.core.settings import Settings
from app.main import create_app

TOKEN = "an-operator-token-of-some-length"
CHUNK = 64 * 1024
HUGE = 20 * 2**20


class Body:
    """A request body of `size` bytes arriving in chunks, counting what was read of it."""

    def __init__(self, size: int, content: bytes = b" ") -> None:
        self.size = size
        self.content = content
        self.read = 0

    async def receive(self) -> Message:
        chunk = self.content * min(CHUNK, self.size - self.read)
        self.read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": self.read < self.size}


class _Whole(Body):
    """A body sent whole, in one chunk."""

    def __init__(self, content: bytes) -> None:
        super().__init__(len(content))
        self.whole = content

    async def receive(self) -> Message:
        self.read = self.size
        return {"type": "http.request", "body": self.whole, "more_body": False}


async def _post(
    settings: Settings,
    path: str,
    body: Body,
    token: str | None,
    client: str = "10.0.0.7",
    more: tuple[tuple[bytes, bytes], ...] = (),
) -> tuple[int, bytes]:
    app = create_app(settings)
    headers = [(b"content-type", b"application/json"), *more]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "client": (client, 5000),
        "server": ("127.0.0.1", 8080),
        "scheme": "http",
        "http_version": "1.1",
        "root_path": "",
    }
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, body.receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    text = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, text


OPERATOR_ROUTES = ["/catalog/items", "/catalog/withdrawals", "/admin/worlds/candidate"]


@pytest.mark.parametrize("path", OPERATOR_ROUTES)
@pytest.mark.parametrize("token", [None, "wrong-token-of-enough-length"])
async def test_a_stranger_is_refused_before_any_of_the_body_is_read(
    path: str, token: str | None
) -> None:
    body = Body(HUGE, b"{")  # not even JSON: who is calling comes first
    status, text = await _post(Settings(admin_token=SecretStr(TOKEN)), path, body, token)
    assert status == 401, text
    assert b'"unauthorized"' in text
    assert body.read == 0


async def test_off_loopback_without_a_token_the_catalog_is_refused_unread() -> None:
    body = Body(HUGE)
    status, _ = await _post(Settings(), "/catalog/items", body, None)
    assert status == 401
    assert body.read == 0


@pytest.mark.parametrize("header", [b"x-forwarded-for", b"forwarded", b"x-real-ip"])
async def test_a_forwarded_request_is_no_loopback_caller(header: bytes) -> None:
    # From a proxy on this host: the peer is loopback, the caller is whoever the proxy served.
    body = Body(10)
    forwarded = ((header, b"203.0.113.9"),)
    status, _ = await _post(Settings(), "/catalog/withdrawals", body, None, "127.0.0.1", forwarded)
    assert status == 401
    assert body.read == 0


async def test_a_body_nested_past_the_parsers_depth_is_refused_not_a_server_error() -> None:
    nested = b'{"items": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    for path in ("/catalog/items", "/recommend"):
        status, text = await _post(Settings(), path, _Whole(nested), None, "127.0.0.1")
        assert status in (400, 422), text


@pytest.mark.parametrize(
    ("path", "limit"),
    [
        ("/catalog/items", 2 * 2**20),
        ("/catalog/withdrawals", 2 * 2**20),
        ("/admin/worlds/candidate", 128 * 1024),
    ],
)
async def test_a_body_past_the_routes_limit_is_refused_once_the_limit_is_read(
    path: str, limit: int
) -> None:
    settings = Settings(admin_token=SecretStr(TOKEN), catalog_max_body_bytes=2 * 2**20)
    body = Body(HUGE)
    status, text = await _post(settings, path, body, TOKEN)
    assert status == 413, text
    assert f"over {limit} bytes".encode() in text
    assert body.read <= limit + CHUNK


async def test_without_a_token_the_admin_routes_are_not_served_at_all() -> None:
    body = Body(HUGE)
    status, _ = await _post(Settings(), "/admin/worlds/candidate", body, None, "127.0.0.1")
    assert status == 404
    assert body.read <= CHUNK  # FastAPI's 404 reads nothing it needs; at most what came
