"""One run: the schedule, the connection pool and the timeouts, all driven by loop callbacks."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Final

from recsys_tools.measure import schedule

from loadtest.openloop.connection import Connection
from loadtest.openloop.http1 import ResponseParser, count_items, is_degraded
from loadtest.openloop.request import (
    CONNECT,
    RESET,
    TIMEOUT,
    Load,
    Record,
    RequestBytes,
    RunResult,
    parse_url,
)

# uvloop rounds timer delays to whole milliseconds and runs a delay under 0.5 ms at once, so
# a request due that soon is sent now rather than spinning the loop until it is due; its
# latency is then timed from the send, so sending early never shortens a measured latency.
_EARLY_S: Final = 0.0005


class Run:
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
        self.connections: set[Connection] = set()  # connected and not dropped
        self.idle: list[Connection] = []  # a stack, so a few hot connections do the work
        self.waiting: deque[int] = deque()  # requests waiting for a connection, may hold settled
        self.live_waiters = 0
        self.opening = 0
        self.owner: dict[int, Connection] = {}
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

    def take_idle(self) -> Connection | None:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            assert conn.transport is not None
            if now - conn.idle_since < self.load.idle_timeout_s and not conn.transport.is_closing():
                return conn
            self.drop(conn, abort=False)
        return None

    def send(self, conn: Connection, index: int) -> None:
        self.records[index].sent = time.monotonic() - self.t0
        self.owner[index] = conn
        conn.send(index, self.requests.get(index))

    def release(self, conn: Connection) -> None:
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

    async def _open(self) -> Connection:
        def factory() -> Connection:
            return Connection(self)

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

    def answered(self, conn: Connection) -> None:
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

    def failed(self, conn: Connection, kind: str) -> None:
        index = conn.current
        self.owner.pop(index, None)
        self.drop(conn, abort=True)
        self.settle(index, 0, kind)

    def lost(self, conn: Connection) -> None:
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

    def unsolicited(self, conn: Connection) -> None:
        """Bytes on an idle connection: nothing was asked, so it can't be trusted."""
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        self.drop(conn, abort=True)

    def drop(self, conn: Connection, *, abort: bool) -> None:
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
    engine = Run(
        load, schedule(rate, duration_s, poisson=poisson, seed=seed), duration_s, stop, start_at
    )
    engine.start()
    try:
        await engine.finished
    finally:
        gc.unfreeze()
        await engine.close()
    return RunResult(engine.records, engine.t0, rate, duration_s, engine.scheduled_s, poisson)
