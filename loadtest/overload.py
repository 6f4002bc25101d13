"""Overload: where admission starts refusing, against what the service can serve, and 3x that.

Two API processes on one local stack, side by side: one with admission out of the way (a
limit no load reaches, no shedding), one as configured. One open-loop rate sweep (Poisson
arrivals, latency from each request's due time) runs against both, alternating at each
rate so that both meet the same machine (a shared machine's speed drifts over minutes):

- capacity: the highest rate the service answers with every answer a 200, p99 within
  P99_BOUND_MS and at most 1% degraded, measured without admission;
- the first rate at which the service with admission answered anything but a 200: it should
  not refuse work it could have done (the issue's bound: at least 0.8 of capacity);
- then `factor` times capacity offered to the service with admission: goodput (clean 200s
  per second) against capacity, how the admitted answers fared, and how fast refusals came,
  as clients saw them and inside the service.

    python -m loadtest.overload                 # the local stack on var/world, started here
    python -m loadtest.overload --url http://127.0.0.1:8080/recommend --capacity 120
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import httpx
from recsys_tools.demo import local_stack, stack_options

from loadtest.histograms import Buckets, quantile, scrape_buckets, subtract
from loadtest.openloop import Load, demo_bodies, demo_users, parse_url, passes, run, summarize
from loadtest.service import api_on

P99_BOUND_MS = 50.0
# The start of an overload run left out: the limit adapting to it.
WARMUP_S = 1.0
FAILS_TO_STOP = 3
# Admission out of the way: a limit no test load reaches, and no shedding on lag.
UNLIMITED = {"min_in_flight": "10000", "max_in_flight": "10000", "max_queue_ms": "1000000"}


@dataclass(frozen=True)
class Step:
    rate: float
    passed: bool  # every answer a 200, p99 within the bound, at most 1% degraded
    p50_ms: float | None
    p99_ms: float | None
    statuses: dict[str, int]
    degraded_share: float | None


async def sweep_step(load: Load, rate: float, duration_s: float, warmup_s: float) -> Step:
    result = await run(load, rate, warmup_s + duration_s, poisson=True)
    summary = summarize(result, skip_s=warmup_s)
    return Step(
        rate=round(rate, 1),
        passed=passes(summary, P99_BOUND_MS, 0.01),
        p50_ms=summary.latency.p50_ms,
        p99_ms=summary.latency.p99_ms,
        statuses=summary.statuses,
        degraded_share=summary.degraded_share,
    )


def _refused(step: Step) -> bool:
    return bool(set(step.statuses) - {"200"})


async def paired_sweep(
    free: Load,
    admitted: Load,
    rates: list[float],
    duration_s: float = 4.0,
    warmup_s: float = 1.0,
) -> tuple[list[Step], list[Step]]:
    """Each rate against the service without admission, then with it, until the first has
    failed FAILS_TO_STOP steps running (a failing step alone may be a hiccup of a shared
    machine: its p99 is a handful of requests) and the second has refused something."""
    without: list[Step] = []
    with_admission: list[Step] = []
    for rate in rates:
        recent = without[-FAILS_TO_STOP:]
        failed_enough = len(recent) == FAILS_TO_STOP and not any(s.passed for s in recent)
        if not failed_enough:
            without.append(await sweep_step(free, rate, duration_s, warmup_s))
            await asyncio.sleep(0.5)  # let the service drain what this rate queued
        if not any(_refused(s) for s in with_admission):
            with_admission.append(await sweep_step(admitted, rate, duration_s, warmup_s))
            await asyncio.sleep(0.5)
        if failed_enough and any(_refused(s) for s in with_admission):
            break
    return without, with_admission


def rates_from(start: float, factor: float, count: int) -> list[float]:
    return [start * factor**k for k in range(count)]


def _scrape_now(url: str) -> Buckets:
    parts = parse_url(url)
    text = httpx.get(f"http://{parts.authority}/metrics", timeout=5.0).text
    return scrape_buckets(text, "recsys_request_duration_seconds", "outcome")


async def _scrape(url: str) -> Buckets:
    """The service's request-duration histogram by outcome, from its /metrics; in a thread,
    so that a scrape in the middle of a run does not hold up the generator's loop."""
    return await asyncio.to_thread(_scrape_now, url)


@dataclass(frozen=True)
class OverloadReport:
    capacity_rps: float
    offered_rps: float
    goodput_rps: float  # clean answers per second under overload
    goodput_share: float  # of capacity
    statuses: dict[str, int]
    errors: dict[str, int]
    degraded_share: float | None  # of the admitted answers
    admitted_p50_ms: float | None
    admitted_p99_ms: float | None  # as clients saw it, the generator's lateness included
    admitted_server_p99_ms: float  # clean answers inside the service, from its histogram
    shed_p50_ms: float | None
    shed_p99_ms: float | None  # as clients saw it: unread waits and the generator's own included
    shed_server_p99_ms: float  # inside the service, from its histogram (bucket-interpolated)
    shed_with_retry_after: int


async def overload(
    load: Load, capacity_rps: float, factor: float = 3.0, duration_s: float = 5.0
) -> OverloadReport:
    """Offer `factor` times `capacity_rps` for `duration_s` after a second left out (the
    service's histogram too is read from the end of that second)."""
    traffic = asyncio.create_task(
        run(load, factor * capacity_rps, duration_s + WARMUP_S, poisson=True)
    )
    await asyncio.sleep(WARMUP_S)
    before = await _scrape(load.url)
    result = await traffic
    inside = subtract(await _scrape(load.url), before)
    shed_inside = inside.get("shed", [])
    summary = summarize(result, skip_s=WARMUP_S)
    admitted = summary.latency_by_status.get("200")
    shed = summary.latency_by_status.get("503")
    clean = summary.ok - summary.degraded
    goodput = clean / duration_s
    return OverloadReport(
        capacity_rps=round(capacity_rps, 1),
        offered_rps=round(factor * capacity_rps, 1),
        goodput_rps=round(goodput, 1),
        goodput_share=round(goodput / capacity_rps, 3),
        statuses=summary.statuses,
        errors=summary.errors,
        degraded_share=summary.degraded_share,
        admitted_p50_ms=admitted.p50_ms if admitted else None,
        admitted_p99_ms=admitted.p99_ms if admitted else None,
        admitted_server_p99_ms=round(quantile(inside.get("ok", []), 0.99) * 1000.0, 3),
        shed_p50_ms=shed.p50_ms if shed else None,
        shed_p99_ms=shed.p99_ms if shed else None,
        shed_server_p99_ms=round(quantile(shed_inside, 0.99) * 1000.0, 3),
        shed_with_retry_after=summary.retry_after_503,
    )


async def _warm(load: Load) -> None:
    await run(load, 20, 2.0)  # the pools, the model, the limit's baseline


async def _on_local_stack(
    world: Path, rates: list[float], factor: float, duration_s: float
) -> dict[str, object]:
    options = stack_options(world)
    run_dir = options.run_dir
    with (
        local_stack(options) as stack,
        api_on(stack, run_dir / "api-unlimited.log", **UNLIMITED) as free_api,
        api_on(stack, run_dir / "api.log") as api,
    ):
        bodies = demo_bodies(20_000, 20)
        free = Load(f"{free_api.url}/recommend", bodies, timeout_s=2.0)
        admitted = Load(f"{api.url}/recommend", bodies, timeout_s=2.0)
        await _warm(free)
        await _warm(admitted)
        unlimited, limited = await paired_sweep(free, admitted, rates)
        capacity = max((s.rate for s in unlimited if s.passed), default=None)
        if capacity is None:
            raise SystemExit(f"no rate passed without admission: {unlimited}")
        await asyncio.sleep(1.0)
        report = await overload(admitted, capacity, factor, duration_s)
    first = next((s.rate for s in limited if _refused(s)), None)
    return {
        "capacity_rps": capacity,
        "first_refusal_rps": first,
        "first_refusal_share": round(first / capacity, 3) if first else None,
        "overload": dataclasses.asdict(report),
        "sweep_without_admission": [dataclasses.asdict(s) for s in unlimited],
        "sweep_with_admission": [dataclasses.asdict(s) for s in limited],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a running service; default: start one on --world")
    parser.add_argument("--capacity", type=float, help="with --url: its capacity, requests/s")
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--start", type=float, default=30.0, help="the sweep's first rate")
    parser.add_argument("--step", type=float, default=1.15, help="the sweep's factor per step")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--users", type=demo_users, default=20_000)
    args = parser.parse_args()
    out: object
    if args.url:
        if args.capacity is None:
            parser.error("--url needs --capacity (measure it with admission out of the way)")
        load = Load(args.url, demo_bodies(args.users, 20), timeout_s=2.0)
        out = dataclasses.asdict(
            asyncio.run(overload(load, args.capacity, args.factor, args.duration))
        )
    else:
        rates = rates_from(args.start, args.step, args.steps)
        out = asyncio.run(_on_local_stack(args.world, rates, args.factor, args.duration))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
