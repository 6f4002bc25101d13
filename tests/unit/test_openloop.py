"""The open-loop load generator against a tiny HTTP server started in the test's own loop.

Each test has a loop of its own, not the session's: the integration suite's in-process app
keeps its refreshers running on the session's loop for the whole run, and the tasks they
schedule (redis-py's pool releases among them) would be counted as this generator's."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from recsys_tools.localstack import leased_port

from loadtest.openloop import (
    CONNECT,
    RESET,
    TIMEOUT,
    Load,
    ProtocolError,
    Record,
    ResponseParser,
    RunResult,
    count_items,
    is_degraded,
    passes,
    percentile,
    recovery_time,
    run,
    schedule,
    summarize,
    sweep,
)
from loadtest.openloop.cli import build_parser

# A loop of the test's own (the module's docstring says why); its fixture shares it.
on_own_loop = pytest.mark.asyncio(loop_scope="function")


@dataclass(frozen=True)
class Request:
    head: bytes
    body: bytes
    connection: int  # which of the server's connections it came on, from 0


# A reply's bytes, or None to close the connection without answering.
Handler = Callable[[Request], Awaitable[bytes | None]]


def reply(status: int = 200, body: bytes = b"{}", headers: str = "") -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
    return head.encode() + body


def recommend(degraded: list[str], items: int = 3) -> bytes:
    answer = {
        "request_id": "r",
        "user_id": "u1",
        "items": [{"item_id": f"i{n}", "score": 0.5, "rank": n + 1} for n in range(items)],
        "degraded": degraded,
    }
    return json.dumps(answer, separators=(",", ":")).encode()


async def ok(request: Request) -> bytes | None:
    return reply(body=recommend([]))


@dataclass
class TinyServer:
    handler: Handler
    hang_up: bool = False  # close each connection after its first answer
    url: str = ""
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    server: asyncio.Server | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self, unix_path: Path | None = None) -> TinyServer:
        if unix_path is None:
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            port = self.server.sockets[0].getsockname()[1]
            self.url = f"http://127.0.0.1:{port}/recommend"
        else:
            self.server = await asyncio.start_unix_server(self._serve, str(unix_path))
            self.url = "http://recsys.local/recommend"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        number = self.connections
        self.connections += 1
        try:
            while (request := await self._read(reader, number)) is not None:
                self.requests.append(request)
                answer = await self.handler(request)
                if answer is None:
                    return
                writer.write(answer)
                await writer.drain()
                if self.hang_up:
                    return
        except ConnectionError:
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    @staticmethod
    async def _read(reader: asyncio.StreamReader, number: int) -> Request | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line.partition(b":")[2])
        return Request(head, await reader.readexactly(length), number)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


Serve = Callable[..., Awaitable[TinyServer]]


@pytest_asyncio.fixture(loop_scope="function")
async def serve() -> AsyncIterator[Serve]:
    """Starts servers for one test; stops them and checks that no task was left behind."""
    before = asyncio.all_tasks()
    servers: list[TinyServer] = []

    async def start(
        handler: Handler = ok, unix_path: Path | None = None, hang_up: bool = False
    ) -> TinyServer:
        servers.append(await TinyServer(handler, hang_up).start(unix_path))
        return servers[-1]

    yield start
    for server in servers:
        await server.close()
    await asyncio.sleep(0)
    left = asyncio.all_tasks() - before - {asyncio.current_task()}
    assert left == set()


BODIES = [b'{"user_id":"u1"}']


def load(url: str, **options: Any) -> Load:
    return dataclasses.replace(Load(url, BODIES), **options)


# Schedule, parsing and summaries, without any server.


def test_constant_schedule_is_evenly_spaced() -> None:
    assert list(schedule(10, 0.5, poisson=False)) == [0.0, 0.1, 0.2, 0.3, 0.4]


def test_poisson_schedule_is_seeded_and_near_the_rate() -> None:
    first = list(schedule(1000, 2.0, poisson=True, seed=3))
    assert first == list(schedule(1000, 2.0, poisson=True, seed=3))
    assert first != list(schedule(1000, 2.0, poisson=True, seed=4))
    assert 1800 < len(first) < 2200
    assert first == sorted(first)
    assert 0 < first[0] < first[-1] < 2.0


def feed_bytewise(parser: ResponseParser, data: bytes) -> int:
    """Feeds one byte at a time; returns how many bytes it took to complete."""
    for n in range(len(data)):
        if parser.feed(data[n : n + 1]):
            return n + 1
    return -1


def test_parser_reads_a_content_length_response_split_anywhere() -> None:
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\nhello"
    parser = ResponseParser()
    assert feed_bytewise(parser, data) == len(data)
    assert (parser.status, parser.body, parser.close, parser.extra) == (200, b"hello", False, False)


def test_parser_reads_chunks_with_extensions_and_trailers() -> None:
    data = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1A\r\n" + b"x" * 26 + b"\r\n0\r\nTrailer: t\r\n\r\n"
    )
    parser = ResponseParser()
    assert feed_bytewise(parser, data) == len(data)
    assert parser.body == b"hello" + b"x" * 26
    whole = ResponseParser()
    assert whole.feed(data)
    assert whole.body == parser.body


def test_parser_skips_interim_responses_and_reads_flags() -> None:
    parser = ResponseParser()
    data = (
        b"HTTP/1.1 100 Continue\r\nRetry-After: 9\r\n\r\n"
        b"HTTP/1.1 503 Busy\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert parser.feed(data)
    assert (parser.status, parser.retry_after, parser.close, parser.body) == (
        503,
        True,
        True,
        b"{}",
    )


def test_parser_reads_a_body_that_ends_with_the_connection() -> None:
    parser = ResponseParser()
    assert not parser.feed(b"HTTP/1.0 200 OK\r\n\r\npart one, ")
    assert not parser.feed(b"part two")
    assert parser.feed_eof()
    assert (parser.body, parser.close) == (b"part one, part two", True)


def test_parser_without_a_body_and_with_trailing_bytes() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n")
    assert (parser.body, parser.extra) == (b"", False)
    parser.reset()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxGARBAGE")
    assert (parser.body, parser.extra) == (b"x", True)
    parser.reset()
    assert not parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n")
    assert not parser.feed_eof()  # cut short: the caller counts a reset


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxyz",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    ],
)
def test_parser_rejects_what_it_cannot_read(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        ResponseParser().feed(data)


@pytest.mark.parametrize(
    ("body", "degraded"),
    [
        (recommend([]), False),
        (recommend(["ranking:timeout"]), True),
        (b'{"items": [], "degraded" : [ ] }', False),
        (b'{"items":[],"degraded":\n["features:error"]}', True),
        (b'{"user_id":"degraded","items":[],"degraded":[]}', False),
        (b'{"error":"internal_error"}', False),
    ],
)
def test_degraded_detection(body: bytes, degraded: bool) -> None:
    assert is_degraded(body) is degraded


def test_items_are_counted() -> None:
    assert count_items(recommend([], items=20)) == 20
    assert count_items(b"{}") == 0


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 11)]
    assert [percentile(values, q) for q in (0, 10, 50, 90, 91, 99, 100)] == [1, 1, 5, 9, 10, 10, 10]
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def rec(
    scheduled: float, status: int = 200, degraded: bool = False, latency: float = 0.01
) -> Record:
    return Record(
        index=0,
        scheduled=scheduled,
        sent=scheduled,
        latency=latency,
        status=status,
        error="" if status else TIMEOUT,
        degraded=degraded,
    )


def test_recovery_time_is_the_last_bad_due_time_before_a_clean_stretch() -> None:
    records = [rec(0.5, 503), rec(1.0), rec(1.1, 200, True), rec(1.4, 0), rec(1.5), rec(1.6)]
    assert recovery_time(records, 1.0, hold_s=0.15) == pytest.approx(0.4)
    assert recovery_time(records, 1.45, hold_s=0.1) == 0.0  # nothing bad after it
    assert recovery_time(records, 1.0, hold_s=0.3) is None  # not clean for long enough
    assert recovery_time(records[:4], 1.0, hold_s=0.1) is None  # still bad when the run ended
    slow = [rec(1.0, latency=0.2), rec(1.2, latency=0.01)]
    assert recovery_time(slow, 1.0, lambda r: r.latency < 0.1, hold_s=0.15) == 0.0
    assert recovery_time(slow, 0.9, lambda r: r.latency < 0.1, hold_s=0.1) == pytest.approx(0.1)


def test_a_relapse_after_a_clean_stretch_is_not_a_later_recovery() -> None:
    # Clean from 1.3 s for a second, then one timeout at 5 s: recovered at 0.3 s, not 4.0 s.
    records = [rec(1.0, 0), rec(1.3, 0), *(rec(1.4 + i / 10) for i in range(30)), rec(5.0, 0)]
    records.append(rec(5.2))
    assert recovery_time(records, 1.0, hold_s=1.0) == pytest.approx(0.3)
    # A fault that never settles (bad every 0.4 s) has no stretch of a second.
    flapping = [rec(1.0 + i / 10, 0 if i % 4 == 0 else 200) for i in range(40)]
    assert recovery_time(flapping, 1.0, hold_s=1.0) is None


def test_summary_counts_rates_latencies_and_windows() -> None:
    records = [
        rec(0.00, 200, latency=0.010),
        rec(0.05, 200, True, latency=0.020),
        rec(0.10, 503, latency=0.001),
        rec(0.15, 0, latency=0.500),
        rec(0.20, 200, latency=0.030),
    ]
    records[2].retry_after = True
    result = RunResult(records, 0.0, 20.0, 0.25, 0.25, False)
    summary = summarize(result, window_s=0.1)
    assert (summary.requests, summary.ok, summary.degraded) == (5, 3, 1)
    assert summary.statuses == {"200": 3, "503": 1}
    assert summary.errors == {TIMEOUT: 1}
    assert summary.retry_after_503 == 1
    assert summary.offered_rps == pytest.approx(20.0)
    assert summary.goodput_rps == pytest.approx(3 / 0.65)  # the timeout ended at 0.65 s
    assert summary.degraded_share == pytest.approx(1 / 3)
    assert summary.latency.count == 4
    assert summary.latency.max_ms == pytest.approx(30.0)
    assert summary.latency_by_status["200"].p50_ms == pytest.approx(20.0)
    assert summary.latency_by_status["503"].p99_ms == pytest.approx(1.0)
    windows = [(w.count, w.ok, w.non_200, w.errors, w.degraded) for w in summary.windows]
    assert windows == [(2, 2, 0, 0, 1), (2, 0, 2, 1, 0), (1, 1, 0, 0, 0)]
    assert summary.windows[1].p99_ms == pytest.approx(1.0)
    skipped = summarize(result, window_s=0.1, skip_s=0.1)
    assert skipped.requests == 3
    assert skipped.scheduled_s == pytest.approx(0.15)


# Against a live server.


@on_own_loop
async def test_a_slow_server_gets_the_full_rate_and_latency_includes_its_delay(
    serve: Serve,
) -> None:
    async def slow(request: Request) -> bytes | None:
        await asyncio.sleep(0.2)
        return reply(body=recommend([]))

    server = await serve(slow)
    result = await run(load(server.url), rate=100, duration_s=0.3)
    assert len(result.records) == len(server.requests) == 30
    assert [r.scheduled for r in result.records] == [pytest.approx(i / 100) for i in range(30)]
    assert all(r.status == 200 for r in result.records)
    assert min(r.latency for r in result.records) >= 0.2
    # New connections were opened rather than the schedule waiting for answers.
    assert server.connections > 10
    lag = summarize(result).send_lag.p99_ms
    assert lag is not None
    assert lag < 100  # the schedule held; generous for a busy 2-core machine


@on_own_loop
async def test_waiting_for_a_connection_counts_from_the_due_time(serve: Serve) -> None:
    async def slow(request: Request) -> bytes | None:
        await asyncio.sleep(0.03)
        return reply()

    server = await serve(slow)
    result = await run(load(server.url, max_connections=1), rate=100, duration_s=0.1)
    assert (server.connections, len(result.records)) == (1, 10)
    last = result.records[-1]
    # Ten answers in a row take 0.3 s; the last was due at 0.09 s.
    assert last.latency >= 0.18
    assert last.sent - last.scheduled >= 0.15
    assert [r.latency for r in result.records] == sorted(r.latency for r in result.records)


@on_own_loop
async def test_503_with_retry_after_is_recorded(serve: Serve) -> None:
    async def shed(request: Request) -> bytes | None:
        return reply(503, b'{"error":"overloaded"}', "Retry-After: 1\r\n")

    server = await serve(shed)
    result = await run(load(server.url), rate=100, duration_s=0.05)
    assert {(r.status, r.error, r.retry_after, r.items) for r in result.records} == {
        (503, "", True, -1)
    }
    summary = summarize(result)
    assert (summary.statuses, summary.retry_after_503) == ({"503": 5}, 5)
    assert summary.goodput_rps == 0.0


@on_own_loop
async def test_a_closed_connection_is_a_reset_and_is_replaced(serve: Serve) -> None:
    async def hang_up(request: Request) -> bytes | None:
        return None

    server = await serve(hang_up)
    result = await run(load(server.url), rate=100, duration_s=0.05)
    assert {(r.status, r.error) for r in result.records} == {(0, RESET)}
    assert server.connections == 5


@on_own_loop
async def test_nothing_listening_is_a_connect_error() -> None:
    with leased_port() as port:
        result = await run(load(f"http://127.0.0.1:{port}/recommend"), rate=100, duration_s=0.05)
    assert len(result.records) == 5
    assert {(r.status, r.error, r.sent) for r in result.records} == {(0, CONNECT, -1.0)}


@on_own_loop
async def test_an_unanswered_request_times_out(serve: Serve) -> None:
    async def never(request: Request) -> bytes | None:
        await asyncio.sleep(10)
        return None

    server = await serve(never)
    started = time.monotonic()
    result = await run(load(server.url, timeout_s=0.1), rate=20, duration_s=0.1)
    assert time.monotonic() - started < 1.0
    assert {(r.status, r.error) for r in result.records} == {(0, TIMEOUT)}
    assert all(0.1 <= r.latency < 0.3 for r in result.records)


@on_own_loop
async def test_degraded_answers_and_items_are_read_from_200s(serve: Serve) -> None:
    async def half_degraded(request: Request) -> bytes | None:
        user = json.loads(request.body)["user_id"]
        degraded = ["ranking:timeout"] if user == "u1" else []
        return reply(body=recommend(degraded, items=4))

    server = await serve(half_degraded)
    bodies = [b'{"user_id":"u0"}', b'{"user_id":"u1"}']
    result = await run(Load(server.url, bodies), rate=100, duration_s=0.1)
    assert [r.degraded for r in result.records] == [i % 2 == 1 for i in range(10)]
    assert {r.items for r in result.records} == {4}
    assert summarize(result).degraded_share == pytest.approx(0.5)


@on_own_loop
async def test_the_stop_event_ends_scheduling(serve: Serve) -> None:
    server = await serve()
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.15, stop.set)
    started = time.monotonic()
    result = await run(load(server.url), rate=100, duration_s=5.0, stop=stop)
    assert time.monotonic() - started < 0.5
    assert 12 <= len(result.records) <= 17
    assert all(r.status == 200 for r in result.records)
    assert result.scheduled_s == pytest.approx(0.15, abs=0.03)
    assert summarize(result).offered_rps == pytest.approx(100, rel=0.15)


@on_own_loop
async def test_chunked_answers_and_connection_close(serve: Serve) -> None:
    async def chunked_then_close(request: Request) -> bytes | None:
        head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        body = recommend(["features:error"])
        return head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)

    server = await serve(chunked_then_close)
    result = await run(load(server.url), rate=100, duration_s=0.05)
    assert {(r.status, r.error, r.degraded) for r in result.records} == {(200, "", True)}
    assert server.connections == 5


@on_own_loop
async def test_idle_connections_are_dropped_before_the_server_would(serve: Serve) -> None:
    server = await serve()
    result = await run(load(server.url, idle_timeout_s=0.02), rate=20, duration_s=0.2)
    assert {(r.status, r.error) for r in result.records} == {(200, "")}
    assert server.connections == 4  # each went idle for 50 ms, past the 20 ms allowed


@on_own_loop
async def test_a_connection_the_server_closed_while_idle_is_not_reused(serve: Serve) -> None:
    server = await serve(ok, hang_up=True)
    result = await run(load(server.url), rate=20, duration_s=0.2)
    assert {(r.status, r.error) for r in result.records} == {(200, "")}
    assert server.connections == 4


@on_own_loop
async def test_headers_request_ids_and_a_unix_socket(serve: Serve, tmp_path: Path) -> None:
    server = await serve(ok, tmp_path / "api.sock")
    options = {"headers": {"X-Timeout-Ms": "80"}, "request_id_prefix": "lt-"}
    result = await run(
        load(server.url, unix_socket=str(tmp_path / "api.sock"), **options),
        rate=100,
        duration_s=0.03,
    )
    assert [r.status for r in result.records] == [200, 200, 200]
    heads = [request.head.decode() for request in server.requests]
    assert all(head.startswith("POST /recommend HTTP/1.1\r\n") for head in heads)
    assert all(
        "Host: recsys.local\r\n" in head and "X-Timeout-Ms: 80\r\n" in head for head in heads
    )
    assert [head.split("X-Request-ID: ")[1].split("\r\n")[0] for head in heads] == [
        "lt-0",
        "lt-1",
        "lt-2",
    ]
    assert all(request.body == BODIES[0] for request in server.requests)


@on_own_loop
async def test_sweep_reports_each_rate_and_the_best(serve: Serve) -> None:
    server = await serve()
    result = await sweep(
        load(server.url), [50, 100], duration_s=0.1, p99_ms=1000, warmup_s=0.04, pause_s=0
    )
    assert [(p.rate, p.passed, p.summary.requests) for p in result.points] == [
        (50, True, 5),
        (100, True, 10),
    ]
    assert [p.sent for p in result.points] == [7, 14]
    assert result.best_rate == 100
    assert not passes(result.points[1].summary, p99_ms=0.0, max_degraded_share=0.01)


@on_own_loop
async def test_the_command_line_prints_a_summary(serve: Serve) -> None:
    server = await serve()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loadtest.openloop",
        "--url",
        server.url,
        "--rate",
        "100",
        "--duration",
        "0.1",
        "--users",
        "5",
        "--header",
        "X-Test: yes",
        "--item-pages",
        "3",
        stdout=asyncio.subprocess.PIPE,
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode == 0
    out = json.loads(stdout)
    assert (out["requests"], out["ok"], out["errors"]) == (10, 10, {})
    assert out["generator"]["cpu_us_per_request"] > 0
    assert all(b"X-Test: yes\r\n" in request.head for request in server.requests)
    assert all(
        json.loads(request.body)["user_id"] in {f"u{n}" for n in range(5)}
        for request in server.requests
    )
    contexts = [json.loads(request.body)["context"] for request in server.requests]
    assert all(context["page"] == "product" for context in contexts)
    assert {context["item_id"] for context in contexts} <= {"i0", "i1", "i2"}


PAGES = "give 0 (home feeds) to 1,000,000,000"
USERS = "give 1 to 1,000,000,000 demo users"
LONG = "99999999999999999999... (400 digits)"


@pytest.mark.parametrize(
    ("flag", "given", "said"),
    [
        ("--item-pages", "-1", f"{PAGES}, not -1"),
        ("--item-pages", "1" + "0" * 12, f"{PAGES}, not 1000000000000"),
        ("--item-pages", "9" * 400, f"{PAGES}, not {LONG}"),
        ("--item-pages", "abc", "'abc': a whole number of demo items"),
        ("--item-pages", "1.5", "'1.5': a whole number of demo items"),
        ("--users", "0", f"{USERS}, not 0"),
        ("--users", "-3", f"{USERS}, not -3"),
        ("--users", "1000000001", f"{USERS}, not 1000000001"),
        ("--users", "9" * 400, f"{USERS}, not {LONG}"),
        ("--users", "many", "'many': a whole number of demo users"),
    ],
)
def test_the_command_line_refuses_a_count_past_its_range(
    flag: str, given: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["--url", "http://x/recommend", flag, given])
    assert stopped.value.code == 2
    assert f"{flag}: {said}" in capsys.readouterr().err


def test_the_command_line_takes_the_ends_of_each_counts_range() -> None:
    def parsed(*flags: str) -> argparse.Namespace:
        return build_parser().parse_args(["--url", "http://x/recommend", *flags])

    assert parsed("--users", "1").users == 1
    assert parsed("--users", "1000000000").users == 10**9
    assert parsed("--item-pages", "0").item_pages == 0
    assert parsed("--item-pages", "1000000000").item_pages == 10**9
