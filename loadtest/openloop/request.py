"""What one run sends and keeps: the load, each request's record, the bytes on the wire."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

# The error kinds a Record can carry; "" means an HTTP response arrived (whatever its status).
CONNECT: Final = "connect"  # the connection could not be opened (refused, unreachable, timed out)
RESET: Final = "reset"  # the connection closed or failed before the whole response arrived
TIMEOUT: Final = "timeout"  # no whole response within the timeout, counted from the due time
PROTOCOL: Final = "protocol"  # the bytes that came back are not an HTTP/1.x response
ERROR_KINDS: Final = (CONNECT, RESET, TIMEOUT, PROTOCOL)


@dataclass(slots=True)
class Record:
    """One scheduled request. Offsets are seconds from the run's start; latency is seconds.

    `latency` runs from the due time (or from the send, in the rare case it went out up to
    0.5 ms early) to the end of the response or to the error. `status` is 0 when no response
    arrived, and then `error` is one of ERROR_KINDS. `degraded` and `items` are read from 200
    bodies only (see `is_degraded` and `count_items`); `items` is -1 for other answers.
    """

    index: int
    scheduled: float
    sent: float = -1.0  # -1: never sent (no connection in time)
    latency: float = -1.0  # -1 only while the request is still pending
    status: int = 0
    error: str = ""
    degraded: bool = False
    items: int = -1
    retry_after: bool = False  # the response carried a Retry-After header

    @property
    def end(self) -> float:
        """When the response (or the error) came, as an offset from the start."""
        start = self.scheduled if self.sent < 0 else min(self.scheduled, self.sent)
        return start + self.latency


# A list of bodies is cycled through (encoded into whole requests once, before the run); a
# function is called with each request's index as it is sent, so it must be cheap.
Bodies = Sequence[bytes] | Callable[[int], bytes]


@dataclass(frozen=True, slots=True)
class Load:
    """What to send and how: everything about a run except its rate and length."""

    url: str
    bodies: Bodies
    headers: Mapping[str, str] = field(default_factory=dict)
    method: str = "POST"
    # When set, each request carries `X-Request-ID: <prefix><index>`, to find it in logs.
    request_id_prefix: str | None = None
    # Connect to this unix socket instead of the URL's host and port (the URL still gives
    # the path and the Host header).
    unix_socket: str | None = None
    max_connections: int = 256
    timeout_s: float = 5.0
    # Below uvicorn's 5 s keep-alive, so the client drops an idle connection before the
    # server does, and a request is never written into a connection that is being closed.
    idle_timeout_s: float = 4.0


@dataclass(frozen=True, slots=True)
class RunResult:
    records: list[Record]  # by index, which is also schedule order
    started: float  # time.monotonic() at offset 0: to place outside events on the timeline
    rate: float
    duration_s: float
    scheduled_s: float  # how long requests were scheduled: duration_s, or when stop was set
    poisson: bool


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    path: str
    authority: str  # the Host header


def parse_url(url: str) -> Target:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"need an http:// URL with a host (no TLS): {url!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    authority = parts.netloc.rpartition("@")[2]
    return Target(parts.hostname, parts.port or 80, path, authority)


class RequestBytes:
    """Request bytes, with the head encoded once and fixed requests encoded only once."""

    def __init__(self, load: Load, target: Target) -> None:
        headers = {"host": ("Host", target.authority)}
        headers["content-type"] = ("Content-Type", "application/json")
        for name, value in load.headers.items():
            headers[name.lower()] = (name, value)
        if "content-length" in headers or "transfer-encoding" in headers:
            raise ValueError("Content-Length is computed; Transfer-Encoding is not supported")
        lines = [f"{load.method} {target.path} HTTP/1.1"]
        lines += [f"{name}: {value}" for name, value in headers.values()]
        if any("\r" in line or "\n" in line for line in lines):
            raise ValueError("a header or the URL holds a line break")
        self._head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._prefix = load.request_id_prefix
        self._body_for = load.bodies if callable(load.bodies) else None
        self._bodies = [] if callable(load.bodies) else list(load.bodies)
        if self._body_for is None and not self._bodies:
            raise ValueError("no bodies to send")
        # Requests that never vary are encoded once, before the run.
        varies = self._prefix is not None or self._body_for is not None
        self._fixed = [] if varies else [self._encode(body) for body in self._bodies]

    def get(self, index: int) -> bytes:
        if self._fixed:
            return self._fixed[index % len(self._fixed)]
        if self._body_for is not None:
            return self._encode(self._body_for(index), index)
        return self._encode(self._bodies[index % len(self._bodies)], index)

    def _encode(self, body: bytes, index: int = -1) -> bytes:
        request_id = "" if self._prefix is None else f"X-Request-ID: {self._prefix}{index}\r\n"
        length = f"{request_id}Content-Length: {len(body)}\r\n\r\n".encode("latin-1")
        return self._head + length + body
