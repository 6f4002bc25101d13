"""Overload: measure the service's capacity, then offer several times it, open loop.

Capacity is the rate of clean answers (200, not degraded) with the worker kept exactly full:
a closed loop of `concurrency` connections, each sending its next request as soon as the
last is answered, never more in flight than admission control takes. Then the open-loop
generator offers `factor` times that, and the report says what admission control did with
the excess: how many were refused, how fast, and how the admitted requests fared.

    python -m loadtest.overload                 # the local stack on var/world, started here
    python -m loadtest.overload --url http://127.0.0.1:8080/recommend --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from loadtest.histograms import Buckets, quantile, scrape_buckets, subtract
from loadtest.openloop import (
    Load,
    RequestBytes,
    ResponseParser,
    demo_bodies,
    is_degraded,
    parse_url,
    run,
    summarize,
)
from loadtest.service import local_service


async def _closed_worker(load: Load, first: int, step: int, until: float) -> int:
    target = parse_url(load.url)
    requests = RequestBytes(load, target)
    reader, writer = await asyncio.open_connection(target.host, target.port)
    parser = ResponseParser()
    clean, index = 0, first
    try:
        while time.monotonic() < until:
            parser.reset()
            writer.write(requests.get(index))
            while not parser.feed(data := await reader.read(65536)):
                if not data:
                    raise ConnectionError("the server closed the connection")
            clean += parser.status == 200 and not is_degraded(parser.body)
            index += step
    finally:
        writer.close()
    return clean


async def capacity(load: Load, concurrency: int, duration_s: float) -> float:
    """Clean answers per second with `concurrency` requests always outstanding."""
    until = time.monotonic() + duration_s
    workers = [_closed_worker(load, n, concurrency, until) for n in range(concurrency)]
    started = time.monotonic()
    clean = sum(await asyncio.gather(*workers))
    return clean / (time.monotonic() - started)


async def _scrape(url: str) -> Buckets:
    """The service's request-duration histogram by outcome, from its /metrics."""
    parts = parse_url(url)
    async with httpx.AsyncClient(base_url=f"http://{parts.authority}", timeout=5.0) as client:
        text = (await client.get("/metrics")).text
    return scrape_buckets(text, "recsys_request_duration_seconds", "outcome")


@dataclass(frozen=True)
class OverloadReport:
    capacity_rps: float
    offered_rps: float
    goodput_rps: float  # clean answers per second under overload
    goodput_share: float  # of capacity
    statuses: dict[str, int]
    errors: dict[str, int]
    degraded_share: float | None
    admitted_p50_ms: float | None
    admitted_p99_ms: float | None
    shed_p50_ms: float | None
    shed_p99_ms: float | None  # as clients saw it: unread waits and the generator's own included
    shed_server_p99_ms: float  # inside the service, from its histogram (bucket-interpolated)
    shed_with_retry_after: int


async def overload(
    load: Load, concurrency: int, factor: float = 3.0, duration_s: float = 5.0
) -> OverloadReport:
    measured = await capacity(load, concurrency, duration_s=3.0)
    await asyncio.sleep(0.5)
    before = await _scrape(load.url)
    result = await run(load, factor * measured, duration_s + 1.0, poisson=True)
    shed_inside = subtract(await _scrape(load.url), before).get("shed", [])
    summary = summarize(result, skip_s=1.0)
    admitted = summary.latency_by_status.get("200")
    shed = summary.latency_by_status.get("503")
    clean = summary.ok - summary.degraded
    goodput = clean / duration_s
    return OverloadReport(
        capacity_rps=round(measured, 1),
        offered_rps=round(factor * measured, 1),
        goodput_rps=round(goodput, 1),
        goodput_share=round(goodput / measured, 3),
        statuses=summary.statuses,
        errors=summary.errors,
        degraded_share=summary.degraded_share,
        admitted_p50_ms=admitted.p50_ms if admitted else None,
        admitted_p99_ms=admitted.p99_ms if admitted else None,
        shed_p50_ms=shed.p50_ms if shed else None,
        shed_p99_ms=shed.p99_ms if shed else None,
        shed_server_p99_ms=round(quantile(shed_inside, 0.99) * 1000.0, 3),
        shed_with_retry_after=summary.retry_after_503,
    )


async def _on_local_stack(
    world: Path, concurrency: int, factor: float, duration_s: float
) -> OverloadReport:
    with local_service(world, max_in_flight=str(concurrency)) as (api, _):
        load = Load(f"{api.url}/recommend", demo_bodies(20_000, 20), timeout_s=2.0)
        await run(load, 50, 2.0)  # warm the pools and the model
        return await overload(load, concurrency, factor, duration_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a running service; default: start one on --world")
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--concurrency", type=int, default=8, help="RECSYS_MAX_IN_FLIGHT")
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--users", type=int, default=20_000)
    args = parser.parse_args()
    if args.url:
        load = Load(args.url, demo_bodies(args.users, 20), timeout_s=2.0)
        report = asyncio.run(overload(load, args.concurrency, args.factor, args.duration))
    else:
        report = asyncio.run(
            _on_local_stack(args.world, args.concurrency, args.factor, args.duration)
        )
    print(json.dumps(dataclasses.asdict(report), indent=2))


if __name__ == "__main__":
    main()
