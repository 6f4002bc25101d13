"""The gate in front of the routes, as plain ASGI so that refusing costs next to nothing.

For every request: a request id (the caller's X-Request-ID when it is sane), echoed in a
response header and kept in the scope for error bodies. For every POST route that takes a
body (/recommend, /events, and the operator's /catalog and /admin ones), each with an
admission and a size limit of its own, in order:
who the caller is, where the route asks (401/403, before a byte of the body is read);
the content type (415); the body, read whole under a deadline (408) and a size limit (413)
before the request holds anything a slow sender could keep from others; a large body that
would make many validation errors (422, app.api.precheck); admission (503
with Retry-After when the worker is full or behind); then the route, or for /recommend
with a valid body the gate's direct answer (app.api.recommend). One count and duration per
request by outcome, and each answer's service time back to admission.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.access import Refused
from app.api.errors import error_body, summary
from app.api.models import REQUEST_ID_HEADER, ErrorField
from app.api.precheck import many_errors
from app.core.metrics import ServiceMetrics
from app.core.outcomes import Outcome
from app.core.throttled_log import ThrottledLog
from app.process.admission import Admission, OverloadedError

RETRY_AFTER_S = "1"
refusals = ThrottledLog(logging.getLogger("recsys.admission"))
_REQUEST_ID = REQUEST_ID_HEADER.encode()
# After a body left unread, the connection cannot carry another request.
_CLOSE = [(b"connection", b"close")]
# Whole answers are the ones whose service time says how loaded the worker is: a degraded
# one may have waited out a slow or absent dependency's timeout, which no concurrency of
# the worker's causes (and cutting concurrency would not cure), or skipped work it had.
# Except one that ran out of its whole budget (the route marks it `exhausted`): every
# dependency call is bounded well inside the budget, so that is queueing in the worker,
# the very thing the limit is for (an overload's first moments, a machine turned busy).
_TELLING = frozenset({Outcome.OK})
# The debug pages hold user ids and run no script: no script, frame, or other origin may
# touch them (Swagger UI at /docs needs its own scripts, so it is left out).
DEBUG_PATHS = "/debug"
_DEBUG_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; "
        b"frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of a header, by its lower-case name (as ASGI gives names)."""
    for key, value in headers:
        if key == name:
            return value
    return None


def request_id(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The caller's id when it is 1-64 printable ASCII characters; a fresh one otherwise."""
    supplied = header(headers, _REQUEST_ID)
    if supplied and len(supplied) <= 64 and supplied.isascii():
        text = supplied.decode("ascii")
        if text.isprintable():
            return text
    return uuid.uuid4().hex


def is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    if media.count(b"/") != 1:  # FastAPI reads such a type as text/plain, never as JSON
        return False
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


def _outcome_of(status: int) -> Outcome:
    if status == 503:
        return Outcome.SHED
    return Outcome.INVALID if 400 <= status < 500 else Outcome.ERROR


@dataclass(frozen=True, slots=True)
class Gated:
    """A POST route behind the gate: its own admission, its body's model for the precheck,
    and where its outcome and duration are counted (None: the route counts its own)."""

    admission: Admission
    model: type[BaseModel]
    observe: Callable[[Outcome, float], None] | None = None
    # Who the caller is (kept in the scope's state as `caller`), or why it is refused.
    authorize: Callable[[Scope], str | Refused] | None = None
    # Larger bodies get a 413; None: the gate's own limit. The same for the body's deadline.
    max_body_bytes: int | None = None
    body_timeout_s: float | None = None
    # Answers an admitted request from the body read here and returns its status, or None,
    # having sent nothing, where the app's route must answer it.
    serve: Callable[[Scope, bytes, Send], Awaitable[int | None]] | None = None


class Gate:
    def __init__(
        self,
        app: ASGIApp,
        routes: Mapping[str, Gated],
        metrics: ServiceMetrics,
        max_body_bytes: int,
        body_timeout_s: float,
    ) -> None:
        self.app = app
        self._routes = routes
        self._metrics = metrics
        self._max_body_bytes = max_body_bytes
        self._body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope["headers"])
        state: dict[str, Any] = scope.setdefault("state", {})
        state["request_id"] = rid
        tagged = _tagging(send, rid, scope["path"].startswith(DEBUG_PATHS))
        gated = self._routes.get(scope["path"]) if scope["method"] == "POST" else None
        if gated is None:
            await self.app(scope, receive, tagged)
            return
        started = time.perf_counter()
        status = 500  # what an exception escaping the route becomes
        try:
            status = await self._gated(gated, scope, receive, tagged, state)
        finally:
            if gated.observe is not None:
                outcome = state.get("outcome") or _outcome_of(status)
                gated.observe(outcome, time.perf_counter() - started)

    async def _gated(
        self, gated: Gated, scope: Scope, receive: Receive, send: Send, state: dict[str, Any]
    ) -> int:
        """Run a gated POST through the checks; return the status it was answered with."""
        rid = state["request_id"]
        admission = gated.admission
        if gated.authorize is not None:
            caller = gated.authorize(scope)
            if isinstance(caller, Refused):
                headers = [*caller.headers, *_CLOSE]
                return await _refuse(send, caller.status, caller.code, caller.message, rid, headers)
            state["caller"] = caller
        if not is_json(header(scope["headers"], b"content-type")):
            message = "send the body as application/json"
            return await _refuse(send, 415, "unsupported_media_type", message, rid)
        # Deadlines count from when the request probably arrived, its unread wait included.
        arrived = time.monotonic() - admission.queued_s
        limit = self._max_body_bytes if gated.max_body_bytes is None else gated.max_body_bytes
        deadline = self._body_timeout_s if gated.body_timeout_s is None else gated.body_timeout_s
        try:
            async with asyncio.timeout(deadline):
                body = await _read_body(receive, limit)
        except TimeoutError:
            message = f"the body did not arrive within {deadline * 1000:.0f} ms"
            return await _refuse(send, 408, "request_timeout", message, rid, _CLOSE)
        if body is None:
            message = f"the body is over {limit} bytes"
            return await _refuse(send, 413, "body_too_large", message, rid, _CLOSE)
        fields, total = many_errors(body, gated.model)
        if fields:
            message = summary(fields, total)
            return await _refuse(send, 422, "invalid_request", message, rid, fields=fields)
        try:
            await admission.enter()
        except OverloadedError as exc:
            self._metrics.refusal_count[exc.reason].inc()
            refusals.warning(exc.reason, "refused a request (%s): %s", exc.reason, exc)
            headers = [(b"retry-after", RETRY_AFTER_S.encode())]
            return await _refuse(send, 503, "overloaded", f"try again: {exc}", rid, headers)
        state["arrived"] = arrived
        admitted = time.perf_counter()
        try:
            if gated.serve is not None:
                served = await gated.serve(scope, body, send)
                if served is not None:
                    return served
            return await _run(self.app, scope, _replaying(body, receive), send)
        finally:
            telling = state.get("outcome") in _TELLING or state.get("exhausted", False)
            admission.leave(time.perf_counter() - admitted if telling else None)


def _tagging(send: Send, rid: str, debug: bool) -> Send:
    added = [(_REQUEST_ID, rid.encode()), *(_DEBUG_HEADERS if debug else ())]

    async def tagged(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), *added]
        await send(message)

    return tagged


async def _refuse(
    send: Send,
    status: int,
    code: str,
    message: str,
    rid: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    fields: Sequence[ErrorField] = (),
) -> int:
    body = error_body(code, message, rid, fields).model_dump_json().encode()
    await send_json(send, status, body, headers or ())
    return status


async def send_json(
    send: Send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """A whole JSON response, its length said."""
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*start, *headers]})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None once it is over `limit` bytes (the rest is never read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the client left; the route will see the disconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _run(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> int:
    status = 500

    async def watching(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    await app(scope, receive, watching)
    return status
