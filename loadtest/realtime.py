"""Real time on the demo world: how fast the consumer applies events, how fresh answers are,
and what ingesting costs the API. `python -m loadtest.realtime [--out docs/benchmarks.json]`.

Three measurements, side by side in one run on the local stack (real Redis, Triton, API and
a real recsys-ingest process):
- ingest rate: events appended straight to the streams while the consumer is stopped, then
  the time one consumer takes to apply them all;
- the API's CPU per /recommend at a steady rate, alone and beside a steady stream of events
  posted to /events (the same process serves both, so the second figure includes them);
- freshness: beside both loads, a user's click on an item of their answer, from the 202 to
  the first answer that no longer holds the item.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from recsys_tools.localstack import start_ingest, unapplied

from app.clients.event_log import by_partition
from app.core.callers import entry, new_token
from app.core.events import Event, EventType, encode_entry
from app.release.keyspace import KeySpace
from loadtest.cpu import tree_cpu_seconds
from loadtest.openloop import Load, demo_bodies, percentile, run
from loadtest.record import record
from loadtest.service import local_service

log = logging.getLogger("loadtest.realtime")
KEYS = KeySpace("recsys")
PARTITIONS = 4
USERS = 20_000
ITEMS = 100_000
KINDS = (EventType.IMPRESSION,) * 3 + (EventType.CLICK, EventType.LIKE, EventType.PURCHASE)
# Events are posted as a named caller, its token checked and its quota kept, as deployed.
CALLER_TOKEN = new_token()
AS_CALLER = {"Authorization": f"Bearer {CALLER_TOKEN}"}


def _events(count: int, seed: int, prefix: str) -> list[Event]:
    rng = random.Random(seed)
    now_ms = int(time.time() * 1000)
    return [
        Event(
            event_id=f"{prefix}{n}",
            user_id=f"u{rng.randrange(USERS)}",
            item_id=f"i{rng.randrange(ITEMS)}",
            type=rng.choice(KINDS),
            ts_ms=now_ms,
        )
        for n in range(count)
    ]


def _append(client: redis.Redis, events: list[Event], per_entry: int = 50) -> None:
    """As the API appends them: each posted batch's share of a partition one entry."""
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(events), per_entry):
        for partition, part in by_partition(events[start : start + per_entry], PARTITIONS).items():
            pipe.xadd(KEYS.events(partition), encode_entry(part))  # type: ignore[arg-type]
    pipe.execute()


def _unapplied(client: redis.Redis) -> int:
    return unapplied(client, KEYS, PARTITIONS)


def ingest_rate(
    redis_url: str, settings: dict[str, str], workdir: Path, count: int
) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    _append(client, _events(count, seed=1, prefix="bulk-"))
    started = time.monotonic()
    consumer = start_ingest(settings, workdir)
    try:
        ready_s = time.monotonic() - started
        begun = time.monotonic()
        while _unapplied(client) > 0:
            time.sleep(0.05)
        took = time.monotonic() - begun
    finally:
        consumer.stop()
        client.close()
    return {
        "events": count,
        "seconds": round(took, 2),
        "events_per_s": round(count / took),
        "consumer_start_s": round(ready_s, 2),
    }


async def _cpu_per_request(
    api_url: str, pid: int, rate: float, duration_s: float, events_rate: float
) -> dict[str, float]:
    recommend = Load(f"{api_url}/recommend", demo_bodies(USERS, 20), timeout_s=2.0)
    tasks = []
    before = tree_cpu_seconds(pid)
    tasks.append(asyncio.create_task(run(recommend, rate, duration_s)))
    if events_rate:
        tasks.append(asyncio.create_task(run(_events_load(api_url), events_rate / 50, duration_s)))
    results = await asyncio.gather(*tasks)
    used = tree_cpu_seconds(pid) - before
    answered = sum(1 for r in results[0].records if r.status == 200)
    return {
        "recommend_ok": answered,
        "cpu_ms_per_recommend": round(1000 * used / max(answered, 1), 3),
        "p99_ms": round(
            percentile(sorted(r.latency for r in results[0].records if r.status == 200), 99) * 1000,
            1,
        ),
    }


def _events_load(api_url: str) -> Load:
    bodies = []
    for n in range(200):
        batch = [
            {
                "event_id": e.event_id,
                "user_id": e.user_id,
                "item_id": e.item_id,
                "type": e.type.value,
            }
            for e in _events(50, seed=100 + n, prefix=f"live{n}-")
        ]
        bodies.append(json.dumps({"events": batch}).encode())
    return Load(f"{api_url}/events", bodies, headers=AS_CALLER, timeout_s=2.0)


async def _answer(client: httpx.AsyncClient, body: dict[str, Any]) -> list[str]:
    """The answer's items; a request shed beside the load (503) is asked again, as a
    frontend retries it."""
    while True:
        answer = await client.post("/recommend", json=body)
        if answer.status_code == 200:
            return [item["item_id"] for item in answer.json()["items"]]
        if answer.status_code != 503:
            answer.raise_for_status()
        await asyncio.sleep(0.01)


async def _freshness(api_url: str, probes: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    took = []
    async with httpx.AsyncClient(base_url=api_url, timeout=5.0) as client:
        for n in range(probes):
            user = f"u{rng.randrange(USERS)}"
            body = {"user_id": user, "num_items": 20}
            items = await _answer(client, body)
            event = {
                "event_id": f"probe-{seed}-{n}",
                "user_id": user,
                "item_id": items[0],
                "type": "click",
            }
            answer = await client.post("/events", json={"events": [event]}, headers=AS_CALLER)
            accepted = time.monotonic()
            assert answer.status_code == 202, answer.text
            while True:
                now = await _answer(client, body)
                if items[0] not in now:
                    break
                if time.monotonic() - accepted > 10:
                    raise RuntimeError(f"probe {n}: the click never reached the answer")
                await asyncio.sleep(0.01)
            took.append(time.monotonic() - accepted)
            await asyncio.sleep(0.1)
    return took


async def _fresh_under_load(
    api_url: str, rate: float, events_rate: float, probes: int
) -> list[float]:
    recommend = Load(f"{api_url}/recommend", demo_bodies(USERS, 20), timeout_s=2.0)
    stop = asyncio.Event()
    background = [
        asyncio.create_task(run(recommend, rate, 600, stop=stop)),
        asyncio.create_task(run(_events_load(api_url), events_rate / 50, 600, stop=stop)),
    ]
    await asyncio.sleep(2.0)
    try:
        return await _freshness(api_url, probes, seed=7)
    finally:
        stop.set()
        await asyncio.gather(*background)


def measure(world: Path, args: argparse.Namespace) -> dict[str, Any]:
    callers = entry("bench", CALLER_TOKEN)
    with local_service(world, event_partitions=str(PARTITIONS), event_callers=callers) as (
        api,
        stack,
    ):
        run_dir = Path(stack.settings.artifacts_dir).parent / "realtime"
        settings = {
            "RECSYS_REDIS_URL": stack.settings.redis_url,
            "RECSYS_ARTIFACTS_DIR": str(stack.settings.artifacts_dir),
            "RECSYS_EVENT_PARTITIONS": str(PARTITIONS),
        }
        rate = ingest_rate(stack.settings.redis_url, settings, run_dir / "bulk", args.bulk)
        log.info("ingest: %s", rate)
        consumer = start_ingest(settings, run_dir / "live")
        try:
            # A warm-up first: the first seconds of a fresh worker cost more.
            asyncio.run(_cpu_per_request(api.url, api.pid, args.rate, 3.0, 0))
            alone = asyncio.run(_cpu_per_request(api.url, api.pid, args.rate, args.duration, 0))
            beside = asyncio.run(
                _cpu_per_request(api.url, api.pid, args.rate, args.duration, args.events_rate)
            )
            log.info("cpu alone %s, beside events %s", alone, beside)
            fresh = asyncio.run(
                _fresh_under_load(api.url, args.fresh_rate, args.events_rate, args.probes)
            )
        finally:
            consumer.stop()
    fresh_sorted = sorted(fresh)
    return {
        "ingest": rate,
        "recommend_rate": args.rate,
        "freshness_recommend_rate": args.fresh_rate,
        "events_rate": args.events_rate,
        "cpu_alone": alone,
        "cpu_beside_events": beside,
        "cpu_ratio": round(beside["cpu_ms_per_recommend"] / alone["cpu_ms_per_recommend"], 3),
        "freshness_s": {
            "probes": len(fresh),
            "p50": round(statistics.median(fresh_sorted), 3),
            "p99": round(percentile(fresh_sorted, 99), 3),
            "max": round(fresh_sorted[-1], 3),
        },
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument(
        "--rate", type=float, default=100.0, help="/recommend per second, for the CPU figures"
    )
    parser.add_argument(
        "--fresh-rate", type=float, default=200.0, help="/recommend per second, for freshness"
    )
    parser.add_argument("--events-rate", type=float, default=500.0, help="events per second")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--bulk", type=int, default=50_000, help="events for the ingest rate")
    parser.add_argument("--probes", type=int, default=40)
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    args = parser.parse_args()
    figures = measure(args.world, args)
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "realtime", {"command": "python -m loadtest.realtime", "runs": [figures]})


if __name__ == "__main__":
    main()
