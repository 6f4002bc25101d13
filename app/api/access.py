"""Who is calling: bearer tokens, the loopback rule, and the callers allowed to post events.

The client address is the socket's peer, or, from a proxy RECSYS_TRUSTED_PROXIES names
(none by default), the address its X-Forwarded-For gives (uvicorn rewrites it). A proxy on
this host connects from loopback, so every client it forwarded would look local: a request
that carries X-Forwarded-For, Forwarded or X-Real-IP is therefore never a loopback caller,
whoever forwarded it. Behind a proxy, callers hold tokens.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import math
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import SecretStr
from starlette.exceptions import HTTPException
from starlette.types import Scope

from app.core.callers import LOOPBACK, UNKNOWN, Callers
from app.core.metrics import ServiceMetrics
from app.core.outcomes import EventPost
from app.core.token_bucket import TokenBuckets

_FORWARDED = frozenset({b"x-forwarded-for", b"forwarded", b"x-real-ip"})


def loopback(scope: Scope) -> bool:
    """Whether the caller is a process on this host, not one a proxy forwarded."""
    if any(key in _FORWARDED for key, _ in scope["headers"]):
        return False
    client = scope.get("client")
    try:
        return client is not None and ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


def _authorization(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str, str]:
    for key, value in headers:
        if key == b"authorization":
            scheme, _, rest = value.decode("latin-1").partition(" ")
            return scheme.lower(), rest.strip()
    return "", ""


def bearer(scope: Scope) -> str:
    """The bearer token sent, or ""."""
    scheme, value = _authorization(scope["headers"])
    return value if scheme == "bearer" else ""


def bearer_or_basic_password(scope: Scope) -> str:
    """The bearer token, or the password of Basic credentials (what a browser sends)."""
    scheme, value = _authorization(scope["headers"])
    if scheme == "bearer":
        return value
    if scheme == "basic":
        try:
            return base64.b64decode(value, validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return ""
    return ""


def holds(sent: str, token: SecretStr | None) -> bool:
    """Whether `sent` is the configured token (never, with none configured), compared in
    constant time: the one check of the admin and debug tokens."""
    if token is None:
        return False
    return hmac.compare_digest(sent.encode(), token.get_secret_value().encode())


def debug_allowed(scope: Scope, token: SecretStr | None) -> bool:
    """Whether the caller may read traces (and so force one): it holds the debug token,
    or, where none is set, it is on loopback."""
    if token is None:
        return loopback(scope)
    return holds(bearer_or_basic_password(scope), token)


@dataclass(frozen=True, slots=True)
class Refused:
    status: int
    code: str
    message: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


_CHALLENGE = ((b"www-authenticate", b"Bearer"),)
OPERATOR = "operator"


def operator(scope: Scope, token: SecretStr | None, loopback_without_token: bool) -> str | Refused:
    """Who may change what serves (/catalog, /admin): the holder of RECSYS_ADMIN_TOKEN, or,
    where none is set and the route allows it, a caller on loopback. The one check of the
    gate (before a byte of the body is read) and of the routes themselves."""
    if token is None and loopback_without_token and loopback(scope):
        return LOOPBACK
    if holds(bearer(scope), token):
        return OPERATOR
    where = " (with none set: loopback only)" if loopback_without_token else ""
    message = f"send Authorization: Bearer <RECSYS_ADMIN_TOKEN>{where}"
    return Refused(401, "unauthorized", message, _CHALLENGE)


class EventAccess:
    """Which caller posts events, and whether its quota has room for a batch."""

    def __init__(
        self, callers: Callers | None, buckets: TokenBuckets, metrics: ServiceMetrics
    ) -> None:
        self._callers = callers
        self._buckets = buckets
        self._posts = metrics.event_post_count

    @property
    def names(self) -> list[str]:
        return [LOOPBACK] if self._callers is None else self._callers.names

    def caller(self, scope: Scope) -> str | Refused:
        """The caller's name; Refused (401, or 403 off loopback with no callers configured)."""
        if self._callers is None:
            if loopback(scope):
                return LOOPBACK
            self._posts[(UNKNOWN, EventPost.UNAUTHENTICATED)].inc()
            message = "no event callers are configured (RECSYS_EVENT_CALLERS): loopback only"
            return Refused(403, "forbidden", message)
        name = self._callers.who(bearer(scope))
        if name is None:
            self._posts[(UNKNOWN, EventPost.UNAUTHENTICATED)].inc()
            message = "send Authorization: Bearer <your event caller token>"
            return Refused(401, "unauthenticated", message, _CHALLENGE)
        return name

    def admit(self, caller: str, events: int) -> float:
        """0.0 when the caller's quota takes `events` now (counted); else seconds to wait."""
        wait = self._buckets.take(caller, events)
        if wait > 0.0:
            self._posts[(caller, EventPost.OVER_QUOTA)].inc()
            return wait
        self._posts[(caller, EventPost.ACCEPTED)].inc()
        return 0.0


def refused(refusal: Refused) -> HTTPException:
    """The refusal as a route raises it (the error handlers give it the one error body)."""
    headers = {k.decode(): v.decode() for k, v in refusal.headers}
    return HTTPException(refusal.status, refusal.message, headers)


def retry_after(wait_s: float) -> str:
    """Whole seconds, at least 1; a batch that can never fit says an hour."""
    return str(3600 if math.isinf(wait_s) else max(1, math.ceil(wait_s)))
