"""`recsys-archive`: keeps every accepted event and what each answer showed, as Parquet by day
(RECSYS_ARCHIVE_URI), configured by RECSYS_* variables like the ingest consumer.

Its own process (a quadlet or unit beside the consumer's); it needs the Redis the API
appends to, and nothing of the world. SIGTERM writes what is in hand, then exits.
`recsys-archive compact [DAY ...]` merges days' files now (default: every day before today),
and is safe beside a running archive.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from prometheus_client import start_http_server

from app.archive.consumer import Archiver, Cadence, Source
from app.archive.rows import Kind, day_of
from app.archive.store import ArchiveStore
from app.clients.archive_stream import ArchiveStream
from app.clients.feature_store import redis_of
from app.core.archive_metrics import ArchiveMetrics
from app.core.errors import ConfigError, RecsysError
from app.core.log_setup import configure_logging
from app.core.settings import Settings, load_settings
from app.core.signalled import until_signalled
from app.release.keyspace import keyspace_of

log = logging.getLogger("recsys.archive")
REDIS_TIMEOUT_S = 5.0
BLOCK_MS = 1000
CONSUMER_NAME = "archive-0"


def sources(settings: Settings) -> list[Source]:
    keys = keyspace_of(settings.redis_key_prefix, settings.event_key_prefix)
    events = [Source(keys.events(p), Kind.EVENTS) for p in range(settings.event_partitions)]
    return [*events, Source(keys.shown, Kind.ANSWERS)]


async def archive(settings: Settings, stop: asyncio.Event) -> None:
    feeds = sources(settings)
    client = redis_of(settings, len(feeds) + 4, REDIS_TIMEOUT_S)
    metrics = ArchiveMetrics()
    if settings.archive_metrics_port:
        start_http_server(settings.archive_metrics_port, settings.host, metrics.registry)
    store = ArchiveStore(settings.archive_uri)
    cadence = Cadence(
        settings.archive_flush_s, settings.archive_flush_rows, settings.archive_compact_every_s
    )
    try:
        archiver = Archiver(
            ArchiveStream(client, CONSUMER_NAME, settings.archive_batch, BLOCK_MS),
            store,
            metrics,
            feeds,
            cadence,
            settings.archive_max_future_s,
        )
        await archiver.join()
        log.info(
            "archiving %d event partitions and the answer log into %s",
            settings.event_partitions,
            settings.archive_uri,
        )
        await archiver.run(stop)
    finally:
        await client.aclose()


def compact(settings: Settings, days: list[str]) -> None:
    store = ArchiveStore(settings.archive_uri)
    today = day_of(int(time.time() * 1000))
    for kind in Kind:
        chosen = days or [day for day in store.days(kind) if day < today]
        for day in chosen:
            merged, rows = store.compact(kind, day)
            said = f"{merged} files merged, {rows} rows" if merged else "nothing to merge"
            print(f"{kind} {day}: {said}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="recsys-archive", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command")
    merging = commands.add_parser("compact", help="merge days' files into one each, now")
    merging.add_argument("days", nargs="*", help="YYYY-MM-DD (default: every day before today)")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        settings = load_settings()
        if args.command == "compact":
            compact(settings, args.days)
            return
        asyncio.run(until_signalled(lambda stop: archive(settings, stop)))
    except (ConfigError, RecsysError) as exc:
        log.error("recsys-archive cannot start: %s", exc)
        sys.exit(2)
    log.info("recsys-archive stopped")


if __name__ == "__main__":
    main()
