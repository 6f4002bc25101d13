"""A closed loop: a fixed number of connections, each sending its next request on an answer.

What a peer comparison at "4 connections" means; the open loop (openloop.py) is what the
rate targets use. Reuses the open loop's request encoding and response parser.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass

from loadtest.openloop import (
    Latency,
    Load,
    ProtocolError,
    RequestBytes,
    ResponseParser,
    is_degraded,
    latency_of,
    parse_url,
)


@dataclass(frozen=True, slots=True)
class ClosedResult:
    connections: int
    elapsed_s: float
    statuses: dict[int, int]
    degraded: int
    latency: Latency  # of the answered 200s
    answers: list[tuple[float, bytes]]  # (seconds, body) of each 200, when asked to keep them

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0


async def _answer(reader: asyncio.StreamReader, parser: ResponseParser) -> None:
    while True:
        data = await reader.read(65536)
        if not data:
            raise ProtocolError("the server closed the connection mid-response")
        if parser.feed(data):
            return


async def closed_loop(
    load: Load,
    connections: int,
    duration_s: float,
    *,
    max_requests: int | None = None,
    keep_answers: bool = False,
) -> ClosedResult:
    """Keep `connections` requests in flight for `duration_s` (or until `max_requests` have
    been sent); count what came back."""
    target = parse_url(load.url)
    requests = RequestBytes(load, target)
    numbers = itertools.count()
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    answers: list[tuple[float, bytes]] = []
    degraded = 0
    limit = max_requests if max_requests is not None else float("inf")

    async def one_connection(stop_at: float) -> None:
        nonlocal degraded
        if load.unix_socket is not None:
            reader, writer = await asyncio.open_unix_connection(load.unix_socket)
        else:
            reader, writer = await asyncio.open_connection(target.host, target.port)
        parser = ResponseParser()
        try:
            while time.monotonic() < stop_at:
                number = next(numbers)
                if number >= limit:
                    break
                parser.reset()
                sent = time.perf_counter()
                writer.write(requests.get(number))
                await asyncio.wait_for(_answer(reader, parser), load.timeout_s)
                took = time.perf_counter() - sent
                statuses[parser.status] += 1
                if parser.status == 200:
                    latencies.append(took)
                    degraded += is_degraded(parser.body)
                    if keep_answers:
                        answers.append((took, parser.body))
                if parser.close:
                    break
        finally:
            writer.close()

    started = time.monotonic()
    await asyncio.gather(*(one_connection(started + duration_s) for _ in range(connections)))
    elapsed = time.monotonic() - started
    return ClosedResult(
        connections, elapsed, dict(statuses), degraded, latency_of(latencies), answers
    )
