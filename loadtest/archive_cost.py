"""What keeping what users did costs and how fast it goes, side by side on one machine:

- the answer log: the API's CPU per request with RECSYS_ANSWER_LOG_SAMPLE=0 and =1 (every
  answer logged), at the same steady open-loop rate, rounds interleaved and rotated as in
  loadtest.trace_cost; medians and the ratio against off;
- the archive: a real recsys-archive draining a backlog of events from a real Redis
  (events/s, from the first entry to the last acknowledged), then keeping up with events
  appended at a steady offered rate (the largest lag seen and whether it ended caught up).

    python -m loadtest.archive_cost [--rounds 3] [--events 200000] [--offered 5000]
        [--batch 100] [--out docs/benchmarks.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from recsys_tools.demo import LocalStack, local_stack, stack_options
from recsys_tools.localstack import start_archive, start_redis, unarchived

from app.archive.rows import Kind
from app.archive.store import ArchiveStore
from app.clients.event_log import EventLog
from app.core.events import Event, EventType
from app.release.keyspace import KeySpace
from loadtest.cpu import Processes, cpu_per_request
from loadtest.openloop import Load, demo_bodies, run
from loadtest.record import record
from loadtest.service import api_on

SETTINGS: dict[str, dict[str, str]] = {
    "off": {"answer_log_sample": "0"},
    "100%": {"answer_log_sample": "1"},
}
NUM_ITEMS = 20
KEYS = KeySpace("recsys")
PARTITIONS = 4
# Senders at once in the steady run: one alone waits on each append's round trip.
APPENDERS = 8


async def _api_cpu_ms(load: Load, processes: Processes, rate: float, duration_s: float) -> float:
    await run(load, rate, 2.0)
    figures = await cpu_per_request(load, processes, rate, duration_s)
    cpu_ms: float = figures["cpu_ms_per_request"]["api"]
    return cpu_ms


def answer_log_cost(
    stack: LocalStack, log_dir: Path, rate: float, duration_s: float, rounds: int
) -> dict[str, Any]:
    runs: dict[str, list[float]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    for turn in range(rounds):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            with api_on(stack, log_dir / f"api-answers-{turn}.log", **SETTINGS[name]) as api:
                load = Load(f"{api.url}/recommend", demo_bodies(20_000, NUM_ITEMS), timeout_s=2.0)
                processes = Processes(api.pid, stack.redis.pid, stack.triton.pid)
                runs[name].append(asyncio.run(_api_cpu_ms(load, processes, rate, duration_s)))
    medians = {name: round(statistics.median(values), 3) for name, values in runs.items()}
    return {
        "rate": rate,
        "duration_s": duration_s,
        "rounds": rounds,
        "api_cpu_ms_per_request": medians,
        "logged_over_off": round(medians["100%"] / (medians["off"] or 1.0), 3),
        "runs": runs,
    }


def _events(start: int, n: int) -> list[Event]:
    now = int(time.time() * 1000)
    return [
        Event(f"e{i}", f"u{i % 50_000}", f"i{i % 9000}", EventType.CLICK, now)
        for i in range(start, start + n)
    ]


async def _append(url: str, start: int, n: int, per_s: float | None, batch: int) -> None:
    """n events from `start`, in batches; at `per_s` when given, else as fast as Redis takes."""
    client = redis.asyncio.Redis.from_url(url)
    log = EventLog(client, KEYS, PARTITIONS, 10_000_000)
    began = time.perf_counter()
    try:
        for sent in range(0, n, batch):
            await log.append(_events(start + sent, min(batch, n - sent)), 5.0)
            if per_s is not None:
                ahead = began + (sent + batch) / per_s - time.perf_counter()
                if ahead > 0:
                    await asyncio.sleep(ahead)
    finally:
        await client.aclose()


def _left(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return unarchived(client, KEYS, PARTITIONS)
    finally:
        client.close()


def _lag_s(url: str) -> float:
    """Age of the oldest event the archive has not acknowledged (0: none)."""
    client = redis.Redis.from_url(url)
    oldest = None
    try:
        for partition in range(PARTITIONS):
            pending: Any = client.xpending(KEYS.events(partition), "archive")
            if pending and pending.get("pending"):
                first = int(pending["min"].decode().split("-")[0])
                oldest = first if oldest is None else min(oldest, first)
    finally:
        client.close()
    return 0.0 if oldest is None else time.time() - oldest / 1000.0


def archive_rate(events: int, offered: float, offered_s: float, batch: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        process, url = start_redis(root / "redis")
        try:
            asyncio.run(_append(url, 0, events, None, batch))
            env = {
                "RECSYS_REDIS_URL": url,
                "RECSYS_EVENT_PARTITIONS": str(PARTITIONS),
                "RECSYS_ARCHIVE_URI": str(root / "archive"),
            }
            started = time.perf_counter()
            archive = start_archive(env, root / "archive-process")
            try:
                while _left(url) > 0:
                    time.sleep(0.05)
                drained_s = time.perf_counter() - started
                steady = _steady(url, events, offered, offered_s, batch)
            finally:
                archive.stop()
            kept = ArchiveStore(str(root / "archive")).read(Kind.EVENTS).num_rows
        finally:
            process.stop()
    return {
        "events_per_entry": batch,
        "backlog_events": events,
        "drained_s": round(drained_s, 2),
        "events_per_s": round(events / drained_s),
        "steady": steady,
        "archived_rows": kept,
        "expected_rows": events + steady["appended"],
    }


def _steady(url: str, start: int, offered: float, seconds: float, batch: int) -> dict[str, Any]:
    total = int(offered * seconds) // APPENDERS * APPENDERS
    lags: list[float] = []

    async def watch(done: asyncio.Event) -> None:
        while not done.is_set():
            lags.append(await asyncio.to_thread(_lag_s, url))
            await asyncio.sleep(0.5)

    async def both() -> float:
        done = asyncio.Event()
        watcher = asyncio.create_task(watch(done))
        began = time.perf_counter()
        share = total // APPENDERS
        await asyncio.gather(
            *(
                _append(url, start + k * share, share, offered / APPENDERS, batch)
                for k in range(APPENDERS)
            )
        )
        took = time.perf_counter() - began
        done.set()
        await watcher
        return took

    took = asyncio.run(both())
    give_up = time.monotonic() + 60.0
    while _left(url) > 0 and time.monotonic() < give_up:
        time.sleep(0.05)
    return {
        "offered_per_s": offered,
        "appended": total,
        "achieved_per_s": round(total / took),
        "max_lag_s": round(max(lags, default=0.0), 2),
        "median_lag_s": round(statistics.median(lags) if lags else 0.0, 2),
        "caught_up": _left(url) == 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=Path, default=Path("var/world"))
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--offered", type=float, default=5000.0)
    parser.add_argument("--offered-s", type=float, default=20.0)
    parser.add_argument("--batch", type=int, default=100, help="events a POST /events carries")
    parser.add_argument("--skip-api", action="store_true", help="the archive's rate only")
    parser.add_argument("--out", type=Path, default=None, help="merge the figures into this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    figures: dict[str, Any] = {"command": "python -m loadtest.archive_cost"}
    figures["archive"] = archive_rate(args.events, args.offered, args.offered_s, args.batch)
    print(json.dumps(figures, indent=2), flush=True)
    if not args.skip_api:
        options = stack_options(args.world)
        with local_stack(options) as stack:
            figures["answer_log"] = answer_log_cost(
                stack, options.run_dir, args.rate, args.duration, args.rounds
            )
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        record(args.out, "archive_cost", figures)


if __name__ == "__main__":
    main()
