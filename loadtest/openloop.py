"""Open-loop HTTP load generator: a fixed schedule of requests, latency timed from the schedule.

A closed-loop generator (N workers, each sending its next request when the previous answer
arrives) slows down exactly when the server does, so it under-reports latency and never shows
what a real stream of users does to a struggling service ("coordinated omission"). Here the
send times are fixed before the run: request i is due at offset i/rate (or at the i-th arrival
of a seeded Poisson process), whatever the server is doing. A request that has to wait for a
free connection, or is sent late because the generator was busy, still has its latency counted
from its due time, so queueing anywhere between the user and the answer shows up.

The client is raw HTTP/1.1 over asyncio Protocols on a pool of keep-alive connections: no task,
no HTTP library and no JSON parsing per request, so one core can offer several thousand
requests per second while the service under test keeps the other. The schedule, the timeout
scan and the connection pool are plain loop callbacks; only opening a connection is a task.

Per request a `Record` keeps the status, an error kind, the latency, whether a 200 was degraded
and how many items it held. `summarize` turns a run into counts, rates, nearest-rank latency
percentiles and a time series of windows; `recovery_time` says how long after an event the
answers went bad for the last time; `sweep` finds the highest rate meeting a p99 bound.
The command line runs on uvloop when it is installed; `run` works in any asyncio loop.

    python -m loadtest.openloop --url http://127.0.0.1:8080/recommend --rate 200 --duration 10
    python -m loadtest.openloop --url http://127.0.0.1:8080/recommend --duration 10 \\
        --sweep 100,200,400,800 --p99-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import math
import random
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast
from urllib.parse import urlsplit

# The error kinds a Record can carry; "" means an HTTP response arrived (whatever its status).
CONNECT: Final = "connect"  # the connection could not be opened (refused, unreachable, timed out)
RESET: Final = "reset"  # the connection closed or failed before the whole response arrived
TIMEOUT: Final = "timeout"  # no whole response within the timeout, counted from the due time
PROTOCOL: Final = "protocol"  # the bytes that came back are not an HTTP/1.x response
ERROR_KINDS: Final = (CONNECT, RESET, TIMEOUT, PROTOCOL)

# uvloop rounds timer delays to whole milliseconds and runs a delay under 0.5 ms at once, so
# a request due that soon is sent now rather than spinning the loop until it is due; its
# latency is then timed from the send, so sending early never shortens a measured latency.
_EARLY_S: Final = 0.0005
_MAX_HEAD: Final = 64 * 1024
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{1,15}")
_DEGRADED_KEY: Final = b'"degraded"'
# Group 1 matches only for an empty list: `"degraded": []` in any JSON spacing.
_DEGRADED: Final = re.compile(rb'"degraded"\s*:\s*\[\s*(\])?')
_ITEM_KEY: Final = b'"item_id"'


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


def schedule(rate: float, duration_s: float, *, poisson: bool, seed: int = 0) -> Iterator[float]:
    """Due offsets in [0, duration_s): evenly spaced, or a seeded Poisson process."""
    if not rate > 0 or not duration_s >= 0:
        raise ValueError("rate must be > 0 and duration_s >= 0")
    if poisson:
        rng = random.Random(seed)
        offset = rng.expovariate(rate)
        while offset < duration_s:
            yield offset
            offset += rng.expovariate(rate)
        return
    index = 0
    # Multiplying rather than adding keeps the 100,000th offset as exact as the first.
    while (offset := index / rate) < duration_s:
        yield offset
        index += 1


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


class ProtocolError(Exception):
    """The server's bytes cannot be read as an HTTP/1.x response."""


_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE = range(4)


class ResponseParser:
    """An incremental HTTP/1.x response reader: status, a few headers, the body.

    Framing follows RFC 9112: no body for 1xx, 204 and 304; Transfer-Encoding wins over
    Content-Length, and ends the body by chunks when its last coding is chunked, otherwise at
    the connection's close; without either the body also runs to the close. Interim 1xx
    responses are skipped. Anything else unreadable raises ProtocolError.
    """

    __slots__ = (
        "_buf",
        "_chunks",
        "_in_trailers",
        "_length",
        "_mode",
        "_pos",
        "body",
        "close",
        "extra",
        "retry_after",
        "status",
    )

    def __init__(self) -> None:
        self._buf = bytearray()
        self.reset()

    def reset(self) -> None:
        self._buf.clear()
        self._mode = _HEAD
        self._length = 0
        self._pos = 0
        self._chunks: list[bytes] = []
        self._in_trailers = False
        self.status = 0
        self.body = b""
        self.close = False  # the server will close, or must not be reused
        self.extra = False  # bytes came after the response: the connection can't be trusted
        self.retry_after = False

    def feed(self, data: bytes) -> bool:
        """Take more bytes; True once a whole response has been read."""
        self._buf += data
        if self._mode == _HEAD and not self._read_head():
            return False
        if self._mode == _LENGTH:
            return self._take_length()
        if self._mode == _CHUNKED:
            return self._take_chunks()
        return False  # _UNTIL_CLOSE: only the end of the connection ends the body

    def feed_eof(self) -> bool:
        """The connection ended; True when that completed a close-delimited response."""
        if self._mode != _UNTIL_CLOSE:
            return False
        self.body = bytes(self._buf)
        self._buf.clear()
        self.close = True
        return True

    def _read_head(self) -> bool:
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    raise ProtocolError("response head too long")
                return False
            head = bytes(self._buf[:end])
            del self._buf[: end + 4]
            self._parse_head(head)
            if not (100 <= self.status < 200):
                return True

    def _parse_head(self, head: bytes) -> None:
        self.retry_after = False  # an interim 1xx head may have come first
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        self.status = int(code)
        if self.status == 101:
            raise ProtocolError("unexpected 101 Switching Protocols")
        self.close = version == b"HTTP/1.0"
        length: int | None = None
        coding: bytes | None = None
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            name = name.strip().lower()
            if name == b"content-length":
                length = self._content_length(value, length)
            elif name == b"transfer-encoding":
                coding = value.rpartition(b",")[2].strip().lower()
            elif name == b"connection":
                tokens = {token.strip() for token in value.lower().split(b",")}
                self.close = b"close" in tokens or (self.close and b"keep-alive" not in tokens)
            elif name == b"retry-after":
                self.retry_after = True
        self._frame(length, coding)

    @staticmethod
    def _content_length(value: bytes, seen: int | None) -> int:
        value = value.strip()
        if not value.isdigit() or (seen is not None and int(value) != seen):
            raise ProtocolError(f"bad Content-Length {value[:40]!r}")
        return int(value)

    def _frame(self, length: int | None, coding: bytes | None) -> None:
        if self.status < 200 or self.status in (204, 304):
            self._mode, self._length = _LENGTH, 0
        elif coding == b"chunked":
            self._mode = _CHUNKED
        elif coding is not None or length is None:
            self._mode, self.close = _UNTIL_CLOSE, True
        else:
            self._mode, self._length = _LENGTH, length

    def _take_length(self) -> bool:
        if len(self._buf) < self._length:
            return False
        self.body = bytes(self._buf[: self._length])
        del self._buf[: self._length]
        self._done()
        return True

    def _take_chunks(self) -> bool:
        buf, pos = self._buf, self._pos
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if len(buf) - pos > _MAX_HEAD:
                    raise ProtocolError("chunk size line or trailer too long")
                self._pos = pos
                return False
            if self._in_trailers:
                if eol == pos:
                    self.body = b"".join(self._chunks)
                    del buf[: eol + 2]
                    self._done()
                    return True
                pos = eol + 2
                continue
            size_text = bytes(buf[pos:eol]).partition(b";")[0].strip()
            if not _HEX.fullmatch(size_text):
                raise ProtocolError(f"bad chunk size {size_text[:40]!r}")
            size = int(size_text, 16)
            if size == 0:
                self._in_trailers = True
                pos = eol + 2
                continue
            data_end = eol + 2 + size
            if len(buf) < data_end + 2:
                self._pos = pos  # read this size line again once the whole chunk is here
                return False
            if buf[data_end : data_end + 2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            self._chunks.append(bytes(buf[eol + 2 : data_end]))
            pos = data_end + 2

    def _done(self) -> None:
        # One request at a time per connection, so anything after the answer is garbage.
        if self._buf:
            self.extra = True


def is_degraded(body: bytes) -> bool:
    """Whether a 200 body lists degraded stages: a `"degraded"` key whose list is not empty.

    Byte matching instead of JSON parsing: the key is searched from the end (it comes after
    the items in the service's answer) and must be followed by `:` and `[`; only `[]`, in any
    JSON spacing, counts as not degraded. A body without the key is not degraded.
    """
    at = body.rfind(_DEGRADED_KEY)
    if at < 0:
        return False
    match = _DEGRADED.match(body, at) or _DEGRADED.search(body)
    return match is not None and match.group(1) is None


def count_items(body: bytes) -> int:
    """How many `"item_id"` keys a 200 body holds: one per item in the service's answer."""
    return body.count(_ITEM_KEY)


class _Connection(asyncio.Protocol):
    __slots__ = ("current", "idle_since", "parser", "run", "transport")

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.parser = ResponseParser()
        self.current = -1  # index of the request it carries, -1 when idle
        self.idle_since = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.run.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.current < 0:
            self.run.unsolicited(self)
            return
        try:
            complete = self.parser.feed(data)
        except ProtocolError:
            self.run.failed(self, PROTOCOL)
            return
        if complete:
            self.run.answered(self)

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost settles any request

    def connection_lost(self, exc: Exception | None) -> None:
        self.run.lost(self)

    def send(self, index: int, data: bytes) -> None:
        assert self.transport is not None
        self.current = index
        self.parser.reset()
        self.transport.write(data)

    def shut(self, *, abort: bool) -> None:
        self.current = -1
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()


class _Run:
    """One run's schedule, connection pool and timeouts, all driven by loop callbacks."""

    def __init__(
        self,
        load: Load,
        offsets: Iterator[float],
        duration_s: float,
        stop: asyncio.Event | None,
        start_at: float | None,
    ) -> None:
        if load.max_connections < 1 or not load.timeout_s > 0:
            raise ValueError("max_connections must be >= 1 and timeout_s > 0")
        self.loop = asyncio.get_running_loop()
        self.load = load
        self.target = parse_url(load.url)
        self.requests = RequestBytes(load, self.target)
        self.offsets = offsets
        self.duration_s = duration_s
        self.stop = stop
        self.t0 = time.monotonic() if start_at is None else start_at
        self.records: list[Record] = []
        self.connections: set[_Connection] = set()  # connected and not dropped
        self.idle: list[_Connection] = []  # a stack, so a few hot connections do the work
        self.waiting: deque[int] = deque()  # requests waiting for a connection, may hold settled
        self.live_waiters = 0
        self.opening = 0
        self.owner: dict[int, _Connection] = {}
        self.inflight: deque[int] = deque()  # unsettled requests in due order, to expire
        self.outstanding = 0
        self.scheduling = True
        self.scheduled_s = duration_s
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.next_offset = next(self.offsets, None)
        self.timer: asyncio.TimerHandle | None = None
        # Timeouts are found by one periodic scan instead of a timer per request.
        self.expire_every = min(0.05, load.timeout_s / 5)
        self.expirer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.expirer = self.loop.call_later(self.expire_every, self.expire)
        if self.stop is not None:
            waiter = self.loop.create_task(self.stop.wait())
            waiter.add_done_callback(lambda _: self.end_scheduling())
            self.tasks.add(waiter)
        if self.next_offset is None:
            self.end_scheduling()
        else:
            self.timer = self.loop.call_later(self._until(self.next_offset), self.tick)

    def _until(self, offset: float) -> float:
        return max(0.0, self.t0 + offset - time.monotonic())

    def tick(self) -> None:
        self.timer = None
        now = time.monotonic() - self.t0
        offset = self.next_offset
        while offset is not None and offset <= now + _EARLY_S:
            if self.stop is not None and self.stop.is_set():
                self.end_scheduling()
                return
            self.dispatch(offset)
            offset = next(self.offsets, None)
        self.next_offset = offset
        if offset is None:
            self.end_scheduling()
        else:
            self.timer = self.loop.call_later(self._until(offset), self.tick)

    def end_scheduling(self) -> None:
        if not self.scheduling:
            return
        self.scheduling = False
        if self.next_offset is not None:  # stopped early
            self.scheduled_s = min(self.duration_s, max(0.0, time.monotonic() - self.t0))
        if self.timer is not None:
            self.timer.cancel()
        self.check_finished()

    def check_finished(self) -> None:
        if not self.scheduling and self.outstanding == 0 and not self.finished.done():
            self.finished.set_result(None)

    def dispatch(self, offset: float) -> None:
        index = len(self.records)
        self.records.append(Record(index, offset))
        self.outstanding += 1
        self.inflight.append(index)
        conn = self.take_idle()
        if conn is not None:
            self.send(conn, index)
            return
        self.waiting.append(index)
        self.live_waiters += 1
        self.open_more()

    def take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            assert conn.transport is not None
            if now - conn.idle_since < self.load.idle_timeout_s and not conn.transport.is_closing():
                return conn
            self.drop(conn, abort=False)
        return None

    def send(self, conn: _Connection, index: int) -> None:
        self.records[index].sent = time.monotonic() - self.t0
        self.owner[index] = conn
        conn.send(index, self.requests.get(index))

    def release(self, conn: _Connection) -> None:
        """A connection is free: give it to the oldest waiting request, or keep it idle."""
        while self.waiting:
            index = self.waiting.popleft()
            if self.records[index].latency < 0:
                self.live_waiters -= 1
                self.send(conn, index)
                return
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def open_more(self) -> None:
        limit = self.load.max_connections
        while self.opening < self.live_waiters and len(self.connections) + self.opening < limit:
            self.opening += 1
            task = self.loop.create_task(self.connect())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def connect(self) -> None:
        try:
            async with asyncio.timeout(self.load.timeout_s):
                conn = await self._open()
        except (OSError, TimeoutError):
            self.opening -= 1
            self.connect_failed()
        else:
            self.opening -= 1
            if conn in self.connections:
                self.release(conn)
            else:  # closed before its first use: failing a request avoids a reconnect storm
                self.connect_failed()
        self.open_more()

    async def _open(self) -> _Connection:
        def factory() -> _Connection:
            return _Connection(self)

        if self.load.unix_socket is not None:
            _, conn = await self.loop.create_unix_connection(factory, self.load.unix_socket)
        else:
            _, conn = await self.loop.create_connection(factory, self.target.host, self.target.port)
        return conn

    def connect_failed(self) -> None:
        """Charge a failed connect to the request that has waited longest for one."""
        while self.waiting:
            index = self.waiting.popleft()
            if self.records[index].latency < 0:
                self.live_waiters -= 1
                self.settle(index, 0, CONNECT)
                return

    def answered(self, conn: _Connection) -> None:
        index, parser = conn.current, conn.parser
        conn.current = -1
        del self.owner[index]
        self.settle_response(index, parser)
        if parser.close or parser.extra:
            self.drop(conn, abort=False)
        else:
            self.release(conn)

    def settle_response(self, index: int, parser: ResponseParser) -> None:
        degraded, items = False, -1
        if parser.status == 200:
            degraded, items = is_degraded(parser.body), count_items(parser.body)
        self.settle(index, parser.status, "", degraded, items, parser.retry_after)

    def failed(self, conn: _Connection, kind: str) -> None:
        index = conn.current
        self.owner.pop(index, None)
        self.drop(conn, abort=True)
        self.settle(index, 0, kind)

    def lost(self, conn: _Connection) -> None:
        if conn not in self.connections:
            return  # dropped by us; its request was settled then
        self.connections.discard(conn)
        index = conn.current
        conn.current = -1
        if index < 0:
            with contextlib.suppress(ValueError):
                self.idle.remove(conn)
        else:
            self.owner.pop(index, None)
            if conn.parser.feed_eof():
                self.settle_response(index, conn.parser)
            else:
                self.settle(index, 0, RESET)
        self.open_more()

    def unsolicited(self, conn: _Connection) -> None:
        """Bytes on an idle connection: nothing was asked, so it can't be trusted."""
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        self.drop(conn, abort=True)

    def drop(self, conn: _Connection, *, abort: bool) -> None:
        """Forget and close a connection; whatever it carried is settled by the caller."""
        self.connections.discard(conn)
        conn.shut(abort=abort)
        self.open_more()

    def settle(
        self,
        index: int,
        status: int,
        error: str,
        degraded: bool = False,
        items: int = -1,
        retry_after: bool = False,
    ) -> None:
        record = self.records[index]
        if record.latency >= 0:
            return
        start = record.scheduled if record.sent < 0 else min(record.scheduled, record.sent)
        record.latency = time.monotonic() - self.t0 - start
        record.status, record.error = status, error
        record.degraded, record.items, record.retry_after = degraded, items, retry_after
        self.outstanding -= 1
        self.check_finished()

    def expire(self) -> None:
        deadline = time.monotonic() - self.t0 - self.load.timeout_s
        while self.inflight:
            record = self.records[self.inflight[0]]
            if record.latency < 0 and record.scheduled > deadline:
                break
            self.inflight.popleft()
            if record.latency < 0:
                self.time_out(record.index)
        self.expirer = self.loop.call_later(self.expire_every, self.expire)

    def time_out(self, index: int) -> None:
        conn = self.owner.pop(index, None)
        if conn is None:
            self.live_waiters -= 1  # it stays in `waiting`, skipped there as settled
        self.settle(index, 0, TIMEOUT)
        if conn is not None:
            self.drop(conn, abort=True)  # its answer may still come, to no one

    async def close(self) -> None:
        self.scheduling = False
        for handle in (self.expirer, self.timer):
            if handle is not None:
                handle.cancel()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for conn in list(self.connections):
            self.connections.discard(conn)
            conn.shut(abort=conn.current >= 0)
        self.idle.clear()


async def run(
    load: Load,
    rate: float,
    duration_s: float,
    *,
    poisson: bool = False,
    seed: int = 0,
    stop: asyncio.Event | None = None,
    start_at: float | None = None,
) -> RunResult:
    """Offer `rate` requests per second for `duration_s` seconds; return once all are settled.

    Works in any running asyncio loop. `stop`, when set, ends the scheduling of new requests;
    those already due (sent or waiting for a connection) still complete or time out. `start_at`
    (a time.monotonic() value, default now) is offset 0, so a caller can line up outside
    events with record offsets; RunResult.started gives it back either way.
    """
    # A full collection over the caller's heap (a test runner holds hundreds of thousands of
    # objects) stalls the schedule for 100+ ms; frozen objects are not scanned. (Freezing is
    # instant; the garbage among them waits for the end of the run.)
    gc.freeze()
    engine = _Run(
        load, schedule(rate, duration_s, poisson=poisson, seed=seed), duration_s, stop, start_at
    )
    engine.start()
    try:
        await engine.finished
    finally:
        gc.unfreeze()
        await engine.close()
    return RunResult(engine.records, engine.t0, rate, duration_s, engine.scheduled_s, poisson)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q% of the values at or below it."""
    if not sorted_values:
        raise ValueError("no values")
    rank = math.ceil(q / 100.0 * len(sorted_values))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


@dataclass(frozen=True, slots=True)
class Latency:
    """Nearest-rank percentiles in milliseconds; None where there were no values."""

    count: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None


def latency_of(seconds: Sequence[float]) -> Latency:
    values = sorted(seconds)
    if not values:
        return Latency(0, None, None, None, None)

    def ms(q: float) -> float:
        return percentile(values, q) * 1000.0

    return Latency(len(values), ms(50), ms(90), ms(99), values[-1] * 1000.0)


@dataclass(frozen=True, slots=True)
class Window:
    """Requests due in [start_s, start_s + window): counts, and p99 over those answered."""

    start_s: float
    count: int
    ok: int  # 200s
    non_200: int  # every other outcome, errors included
    errors: int  # no response at all
    degraded: int
    degraded_share: float | None  # of the 200s
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class Summary:
    requests: int
    scheduled_s: float  # the span the requests were due in, after skip_s
    offered_rps: float  # requests / scheduled_s
    achieved_rps: float  # responses / time from the first due time to the last answer
    goodput_rps: float  # 200s over the same span as achieved_rps
    ok: int
    statuses: dict[str, int]  # HTTP status -> count, responses only
    errors: dict[str, int]  # error kind -> count, requests without a response
    degraded: int
    degraded_share: float | None  # of the 200s
    retry_after_503: int  # 503s that carried Retry-After
    latency: Latency  # every request that got a response
    latency_by_status: dict[str, Latency]
    send_lag: Latency  # how late requests went out: the generator's or the pool's own delay
    window_s: float
    windows: list[Window]


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _window(start_s: float, records: Sequence[Record]) -> Window:
    ok = [r for r in records if r.status == 200]
    degraded = sum(r.degraded for r in ok)
    answered = sorted(r.latency for r in records if r.status)
    p99 = percentile(answered, 99) * 1000.0 if answered else None
    errors = sum(1 for r in records if not r.status)
    return Window(
        start_s=start_s,
        count=len(records),
        ok=len(ok),
        non_200=len(records) - len(ok),
        errors=errors,
        degraded=degraded,
        degraded_share=_share(degraded, len(ok)),
        p99_ms=p99,
    )


def windows_of(
    records: Sequence[Record], start_s: float, end_s: float, window_s: float
) -> list[Window]:
    """Fixed windows over [start_s, end_s) by due time; a window may be empty."""
    if not window_s > 0:
        raise ValueError("window_s must be > 0")
    count = max(0, math.ceil((end_s - start_s) / window_s - 1e-9))
    buckets: list[list[Record]] = [[] for _ in range(count)]
    for record in records:
        slot = int((record.scheduled - start_s) / window_s)
        if 0 <= slot < count:
            buckets[slot].append(record)
    return [_window(start_s + i * window_s, bucket) for i, bucket in enumerate(buckets)]


def summarize(result: RunResult, *, window_s: float = 0.1, skip_s: float = 0.0) -> Summary:
    """Counts, rates, latencies and windows of one run, leaving out requests due before skip_s."""
    records = [r for r in result.records if r.scheduled >= skip_s]
    span = max(result.scheduled_s - skip_s, 1e-9)
    answered = [r for r in records if r.status]
    ok = [r for r in answered if r.status == 200]
    last = max((r.end for r in records), default=result.scheduled_s)
    served_span = max(last, result.scheduled_s) - skip_s
    statuses: dict[int, list[float]] = {}
    for r in answered:
        statuses.setdefault(r.status, []).append(r.latency)
    errors: dict[str, int] = {}
    for r in records:
        if not r.status:
            errors[r.error] = errors.get(r.error, 0) + 1
    degraded = sum(r.degraded for r in ok)
    return Summary(
        requests=len(records),
        scheduled_s=span,
        offered_rps=len(records) / span,
        achieved_rps=len(answered) / served_span if served_span > 0 else 0.0,
        goodput_rps=len(ok) / served_span if served_span > 0 else 0.0,
        ok=len(ok),
        statuses={str(s): len(v) for s, v in sorted(statuses.items())},
        errors=dict(sorted(errors.items())),
        degraded=degraded,
        degraded_share=_share(degraded, len(ok)),
        retry_after_503=sum(1 for r in answered if r.status == 503 and r.retry_after),
        latency=latency_of([r.latency for r in answered]),
        latency_by_status={str(s): latency_of(v) for s, v in sorted(statuses.items())},
        send_lag=latency_of([max(0.0, r.sent - r.scheduled) for r in records if r.sent >= 0]),
        window_s=window_s,
        windows=windows_of(records, skip_s, skip_s + span, window_s),
    )


def is_good(record: Record) -> bool:
    """A 200 that was not degraded."""
    return record.status == 200 and not record.degraded


def recovery_time(
    records: Sequence[Record], since_s: float, good: Callable[[Record], bool] = is_good
) -> float | None:
    """How long after since_s the last bad request was due, judged by due time.

    Returns 0.0 when every request due at or after since_s is good; R when the last bad one
    was due at since_s + R and at least one good one was due after it (so every request due
    after since_s + R was good); None when no good request came after the last bad one, i.e.
    the run ended before the service recovered. For "slower than X" pass a predicate such
    as `lambda r: is_good(r) and r.latency <= X`.
    """
    last_bad: float | None = None
    good_after = False
    for record in sorted(records, key=lambda r: r.scheduled):
        if record.scheduled < since_s:
            continue
        if good(record):
            good_after = True
        else:
            last_bad, good_after = record.scheduled, False
    if last_bad is None:
        return 0.0
    return last_bad - since_s if good_after else None


@dataclass(frozen=True, slots=True)
class SweepPoint:
    rate: float
    passed: bool
    summary: Summary  # of the measured part, after the warm-up
    sent: int  # requests of the whole run, warm-up included


@dataclass(frozen=True, slots=True)
class SweepResult:
    p99_ms: float
    max_degraded_share: float
    best_rate: float | None  # highest passing rate; None when none passed
    points: list[SweepPoint]


def passes(summary: Summary, p99_ms: float, max_degraded_share: float) -> bool:
    """Every request a 200, p99 within the bound, and degraded answers within the share."""
    p99 = summary.latency.p99_ms
    return (
        summary.requests > 0
        and summary.ok == summary.requests
        and p99 is not None
        and p99 <= p99_ms
        and (summary.degraded_share or 0.0) <= max_degraded_share
    )


async def sweep(
    load: Load,
    rates: Sequence[float],
    *,
    duration_s: float,
    p99_ms: float,
    max_degraded_share: float = 0.01,
    warmup_s: float = 2.0,
    pause_s: float = 1.0,
    poisson: bool = False,
    seed: int = 0,
    window_s: float = 1.0,
) -> SweepResult:
    """Each rate in turn, as one run of warmup_s + duration_s with the warm-up left out."""
    points: list[SweepPoint] = []
    for number, rate in enumerate(rates):
        if number:
            await asyncio.sleep(pause_s)  # let the service drain what the last rate queued
        result = await run(load, rate, warmup_s + duration_s, poisson=poisson, seed=seed + number)
        summary = summarize(result, window_s=window_s, skip_s=warmup_s)
        passed = passes(summary, p99_ms, max_degraded_share)
        points.append(SweepPoint(rate, passed, summary, len(result.records)))
    best = max((p.rate for p in points if p.passed), default=None)
    return SweepResult(p99_ms, max_degraded_share, best, points)


def demo_bodies(users: int, num_items: int, *, count: int = 4096, seed: int = 0) -> list[bytes]:
    """Random demo users u0..u{users-1} with a simple context, encoded once and cycled."""
    rng = random.Random(seed)
    bodies = []
    for _ in range(count):
        context = {"device": rng.choice(("mobile", "desktop", "tablet")), "page": "home"}
        body = {"user_id": f"u{rng.randrange(users)}", "num_items": num_items, "context": context}
        bodies.append(json.dumps(body, separators=(",", ":")).encode())
    return bodies


def parse_header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME:VALUE, got {text!r}")
    return name.strip(), value.strip()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.openloop", description=__doc__.split("\n\n")[0] if __doc__ else ""
    )
    p.add_argument("--url", required=True, help="http://host:port/path")
    p.add_argument("--unix-socket", help="connect here instead of the URL's host:port")
    p.add_argument("--rate", type=float, default=100.0, help="requests per second")
    p.add_argument("--duration", type=float, default=10.0, help="seconds (per rate in a sweep)")
    p.add_argument("--poisson", action="store_true", help="Poisson arrivals, not even spacing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--users", type=int, default=20000)
    p.add_argument("--num-items", type=int, default=20)
    p.add_argument("--header", type=parse_header, action="append", default=[], metavar="K:V")
    p.add_argument("--request-id-prefix", help="send X-Request-ID: <prefix><index>")
    p.add_argument("--timeout", type=float, default=5.0, help="per request, seconds")
    p.add_argument("--max-connections", type=int, default=256)
    p.add_argument("--window-ms", type=float, default=1000.0, help="time series window")
    p.add_argument("--windows", action="store_true", help="print the time series too")
    p.add_argument("--sweep", help="comma-separated rates; prints each and the best")
    p.add_argument("--p99-ms", type=float, default=50.0, help="sweep: p99 bound")
    p.add_argument("--max-degraded-pct", type=float, default=1.0, help="sweep: degraded bound")
    p.add_argument("--warmup", type=float, default=2.0, help="sweep: seconds left out per rate")
    return p


def _summary_json(summary: Summary, windows: bool) -> dict[str, Any]:
    out = dataclasses.asdict(summary)
    if not windows:
        del out["windows"]
    return out


async def _cli(args: argparse.Namespace) -> dict[str, Any]:
    load = Load(
        url=args.url,
        bodies=demo_bodies(args.users, args.num_items, seed=args.seed),
        headers=dict(args.header),
        request_id_prefix=args.request_id_prefix,
        unix_socket=args.unix_socket,
        max_connections=args.max_connections,
        timeout_s=args.timeout,
    )
    window_s = args.window_ms / 1000.0
    cpu = time.process_time()
    out: dict[str, Any]
    if args.sweep:
        rates = [float(rate) for rate in args.sweep.split(",") if rate.strip()]
        result = await sweep(
            load,
            rates,
            duration_s=args.duration,
            p99_ms=args.p99_ms,
            max_degraded_share=args.max_degraded_pct / 100.0,
            warmup_s=args.warmup,
            poisson=args.poisson,
            seed=args.seed,
            window_s=window_s,
        )
        sent = sum(p.sent for p in result.points)
        out = {
            "best_rate": result.best_rate,
            "p99_ms": result.p99_ms,
            "max_degraded_share": result.max_degraded_share,
            "points": [
                {"rate": p.rate, "passed": p.passed, **_summary_json(p.summary, args.windows)}
                for p in result.points
            ],
        }
    else:
        one = await run(load, args.rate, args.duration, poisson=args.poisson, seed=args.seed)
        sent = len(one.records)
        out = _summary_json(summarize(one, window_s=window_s), args.windows)
        out = {"url": args.url, "rate": args.rate, "poisson": args.poisson, **out}
    cpu = time.process_time() - cpu
    out["generator"] = {
        "loop": type(asyncio.get_running_loop()).__module__,
        "cpu_s": round(cpu, 3),
        "cpu_us_per_request": round(cpu / sent * 1e6, 1) if sent else None,
    }
    return out


def _run_loop(main: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    json.dump(_run_loop(_cli(args)), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
