"""Faults injected into a real dependency while the open-loop generator keeps a steady load.

A run is: `before_s` of normal traffic, then `inject` (freeze, kill, flush, slow down...),
`during_s` of the fault, then `restore` (resume, restart, reload...), and `after_s` more.
The report says what the clients saw: statuses, full or short answers, the degraded share,
latency, and how long after the dependency was back the answers were clean again. The
integration tests assert on it; `python -m loadtest.faults` prints it for the demo world.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from recsys_tools.localstack import ManagedProcess
from recsys_tools.world.store.redis_loader import load_world_into_redis

from app.release.keyspace import KeySpace
from app.world.schema import world_schema
from loadtest.openloop import (
    Load,
    RunResult,
    demo_bodies,
    is_good,
    percentile,
    recovery_time,
    run,
)
from loadtest.service import local_service

log = logging.getLogger("loadtest.faults")
# How long answers must stay clean for the service to count as recovered.
CLEAN_S = 0.5


# The longest a restore may take (a restart waits for the server to be ready).
MAX_RESTORE_S = 60.0


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[], None]
    restore: Callable[[], None]


@dataclass(frozen=True)
class Timeline:
    """Offsets from the run's start: when the fault began and when the dependency was back."""

    result: RunResult
    fault_s: float
    back_s: float


@dataclass(frozen=True)
class FaultReport:
    fault: str
    requests: int
    server_errors: int  # 5xx, and requests that got no answer at all
    failures: dict[str, int]  # those by status, or by error kind when no answer came
    other_statuses: int  # answers neither 200 nor 5xx
    short_answers: int  # 200s with fewer items than asked for
    degraded: int
    degraded_share: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    before_p50_ms: float | None  # clean answers due before the fault: the machine's pace now
    degraded_p50_ms: float | None  # degraded answers after the first 0.5 s of the fault
    recovery_s: float | None  # None: not clean again before the run ended
    relapses: int  # bad answers due after the recovery's clean stretch
    after_recovery: int  # all answers due after that stretch


async def run_with_fault(
    load: Load,
    rate: float,
    fault: Fault,
    *,
    before_s: float = 1.5,
    during_s: float = 3.0,
    after_s: float = 3.0,
) -> Timeline:
    """Offer `rate` requests/s for the whole run and inject `fault` in the middle of it.

    The traffic goes on for `after_s` once the dependency is back, however long its return
    took (a restart on a busy machine can take seconds).
    """
    started = time.monotonic()
    stop = asyncio.Event()
    longest_s = before_s + during_s + after_s + MAX_RESTORE_S
    traffic = asyncio.create_task(run(load, rate, longest_s, start_at=started, stop=stop))
    await asyncio.sleep(before_s)
    fault_s = time.monotonic() - started
    await asyncio.to_thread(fault.inject)
    await asyncio.sleep(max(0.0, started + before_s + during_s - time.monotonic()))
    await asyncio.to_thread(fault.restore)
    back_s = time.monotonic() - started
    await asyncio.sleep(after_s)
    stop.set()
    return Timeline(await traffic, fault_s, back_s)


def _ms(values: list[float], q: float) -> float:
    return round(percentile(sorted(values), q) * 1000.0, 2) if values else float("nan")


def report(name: str, timeline: Timeline, num_items: int) -> FaultReport:
    records = timeline.result.records
    answered = [r for r in records if r.status]
    ok = [r for r in records if r.status == 200]
    degraded = [r for r in ok if r.degraded]
    settled = timeline.fault_s + 0.5
    during = [r.latency for r in degraded if settled <= r.scheduled < timeline.back_s]
    before = [r.latency for r in ok if not r.degraded and r.scheduled < timeline.fault_s]
    recovery_s = recovery_time(records, timeline.back_s, hold_s=CLEAN_S)
    # After the clean stretch that made the recovery, which is clean by definition.
    after = (
        []
        if recovery_s is None
        else [r for r in records if r.scheduled > timeline.back_s + recovery_s + CLEAN_S]
    )
    return FaultReport(
        fault=name,
        requests=len(records),
        server_errors=sum(1 for r in records if r.status >= 500 or not r.status),
        failures=dict(
            Counter(
                str(r.status) if r.status else r.error
                for r in records
                if r.status >= 500 or not r.status
            )
        ),
        other_statuses=sum(1 for r in answered if r.status != 200 and r.status < 500),
        short_answers=sum(1 for r in ok if r.items < num_items),
        degraded=len(degraded),
        degraded_share=round(len(degraded) / len(ok), 4) if ok else 0.0,
        p50_ms=_ms([r.latency for r in answered], 50),
        p99_ms=_ms([r.latency for r in answered], 99),
        max_ms=_ms([r.latency for r in answered], 100),
        before_p50_ms=_ms(before, 50) if before else None,
        degraded_p50_ms=_ms(during, 50) if during else None,
        recovery_s=recovery_s,
        relapses=sum(1 for r in after if not is_good(r)),
        after_recovery=len(after),
    )


# Faults on local servers ----------------------------------------------------------------------


def frozen(server: ManagedProcess) -> Fault:
    return Fault(f"{server.name} frozen", server.freeze, server.resume)


def killed(server: ManagedProcess, then: Callable[[], None] = lambda: None) -> Fault:
    def restart() -> None:
        server.restart()
        then()

    return Fault(f"{server.name} killed", server.kill, restart)


def flushed(redis_url: str, reload: Callable[[], None]) -> Fault:
    def flush() -> None:
        client = redis.Redis.from_url(redis_url)
        try:
            client.flushall()
        finally:
            client.close()

    return Fault("redis flushed", flush, reload)


def reloader(redis_url: str, world_dir: Path) -> Callable[[], None]:
    """Write the world's features into Redis again (as a restarted Redis would load them)."""

    schema = world_schema(world_dir, None)

    def reload() -> None:
        client = redis.Redis.from_url(redis_url)
        try:
            load_world_into_redis(world_dir, client, schema, KeySpace("recsys"))
        finally:
            client.close()

    return reload


# The demo-world report --------------------------------------------------------------------------


async def _report_all(world: Path, rate: float, num_items: int) -> list[FaultReport]:
    reports = []
    with local_service(world) as (api, stack):
        load = Load(f"{api.url}/recommend", demo_bodies(20_000, num_items), timeout_s=2.0)
        redis_url = stack.settings.redis_url
        reload = reloader(redis_url, world)
        faults = [
            frozen(stack.redis),
            killed(stack.redis, then=reload),
            flushed(redis_url, reload),
            frozen(stack.triton),
            killed(stack.triton),
        ]
        for fault in faults:
            log.info("%s at %.0f requests/s", fault.name, rate)
            timeline = await run_with_fault(load, rate, fault)
            reports.append(report(fault.name, timeline, num_items))
            await asyncio.sleep(1.0)
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--num-items", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    reports = asyncio.run(_report_all(args.world, args.rate, args.num_items))
    print(json.dumps([dataclasses.asdict(r) for r in reports], indent=2))


if __name__ == "__main__":
    main()
