"""`recsys-ingest`: the consumer of the event log, configured by RECSYS_* variables.

Its own process (a quadlet or unit beside the API's): it needs the world's files, for the
items and their vectors, and the Redis the API reads. SIGTERM finishes the batch in hand.

With RECSYS_WORLDS_FILE it applies every event to each world the file names (the stable one
and a candidate served beside it), each world's consumer with its own group on the one event
log, and follows the file: a candidate loaded gets a consumer, one rolled back or replaced
by a promotion loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from dataclasses import dataclass

from prometheus_client import start_http_server

from app.clients.catalog_log import CatalogLog
from app.clients.event_stream import EventStream
from app.clients.feature_store import RedisClient, layout_meta, redis_of
from app.clients.user_state import CLUSTER_CALLS, UserStateScripts
from app.core.errors import ConfigError, RecsysError, SchemaError
from app.core.ingest_metrics import IngestMetrics
from app.core.log_setup import configure_logging
from app.core.settings import Settings, load_settings
from app.core.signalled import until_signalled
from app.ingest.consumer import Consumer, Limits
from app.ingest.refit import ItemRefits
from app.ingest.user_store import Bounds, UserStore
from app.ingest.world import CATALOG_READ_S, IngestWorld, load_ingest_world
from app.process.startup_checks import opened_world
from app.release.keyspace import KeySpace, keyspace_of
from app.release.worlds import WorldRef, read_worlds, world_settings

log = logging.getLogger("recsys.ingest")
# Generous: the consumer's calls are not on anyone's request path, and a blocking read
# waits up to a second by design.
REDIS_TIMEOUT_S = 5.0
MEMORY_EVERY_S = 5.0
# How often the worlds file is read again: a candidate's consumer starts within this.
WORLDS_POLL_S = 2.0


def owned_partitions(settings: Settings) -> list[int]:
    index, count = settings.ingest_share
    return [p for p in range(settings.event_partitions) if p % count == index]


async def _check_layout(client: object, keys: KeySpace, expected: dict[str, str]) -> None:
    stored = await client.hgetall(keys.meta)  # type: ignore[attr-defined]
    text = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in stored.items()}
    if not text:
        raise SchemaError(f"Redis has no {keys.meta}: load the world first (recsys load-redis)")
    differing = {k: (text.get(k), v) for k, v in expected.items() if text.get(k) != v}
    if differing:
        raise SchemaError(f"Redis holds another layout: {differing} (stored, expected)")


async def _world(settings: Settings, client: RedisClient, metrics: IngestMetrics) -> IngestWorld:
    """The world the files hold now (the artifacts directory may be a flipped symlink)."""
    stamp, schema = await asyncio.to_thread(opened_world, settings)
    world_id = "" if stamp is None else stamp.world_id
    keys = keyspace_of(settings.redis_key_prefix, settings.event_key_prefix)
    world = await asyncio.to_thread(
        load_ingest_world,
        settings.artifacts_dir,
        schema,
        world_id,
        lambda world: CatalogLog(client, keys, world),
        settings.catalog_headroom,
        metrics.catalog_skipped.inc,
    )
    if world.arrivals is not None:
        room = world.arrivals.room
        await world.arrivals.changes.agree_on_room(room.capacity, CATALOG_READ_S)
    return world


def _limits(settings: Settings) -> Limits:
    return Limits(
        impressions_to_seen=settings.impressions_to_seen,
        half_life_s=settings.trending_half_life_s,
        dedupe_s=settings.event_dedupe_s,
        claim_idle_s=settings.ingest_claim_idle_s,
        max_deliveries=settings.ingest_max_deliveries,
        trending_user_per_minute=settings.trending_user_per_minute,
    )


def _bounds(settings: Settings) -> Bounds:
    return Bounds(
        dedupe_s=settings.event_dedupe_s,
        positives=settings.user_positives_kept,
        seen=settings.user_seen_kept,
        online_ttl_s=settings.online_user_ttl_s,
    )


async def _watch_memory(consumer: Consumer) -> None:
    while True:
        try:
            await consumer.redis_memory()
        except Exception as exc:  # a gauge, best effort: never the consumer's end
            log.debug("Redis memory not read: %s", exc)
        await asyncio.sleep(MEMORY_EVERY_S)


async def consume(settings: Settings, stop: asyncio.Event, metrics: IngestMetrics) -> None:
    """One world's consumer, until `stop`."""
    partitions = owned_partitions(settings)
    client = redis_of(settings, len(partitions) + CLUSTER_CALLS + 4, REDIS_TIMEOUT_S)
    keys = keyspace_of(settings.redis_key_prefix, settings.event_key_prefix)
    try:
        world = await _world(settings, client, metrics)
        await _check_layout(client, keys, layout_meta(world.schema))
        index, _ = settings.ingest_share
        consumer = Consumer(
            EventStream(client, keys, f"consumer-{index}", settings.ingest_batch),
            world,
            lambda: _world(settings, client, metrics),
            UserStore(UserStateScripts(client, keys), _bounds(settings)),
            metrics,
            partitions=partitions,
            limits=_limits(settings),
            refits=ItemRefits(client, keys),
        )
        await consumer.join()
        log.info(
            "ingesting partitions %s of %d as %s into %s:* (%d items, fold-in %s)",
            partitions,
            settings.event_partitions,
            f"consumer-{index}",
            settings.redis_key_prefix,
            world.size,
            world.params.weighting,
        )
        memory = asyncio.create_task(_watch_memory(consumer))
        try:
            await consumer.run(stop)
        finally:
            memory.cancel()
    finally:
        await client.aclose()
        log.info("stopped ingesting into %s:*", settings.redis_key_prefix)


@dataclass(slots=True)
class _Running:
    stop: asyncio.Event
    task: asyncio.Task[None]


async def _wait(stop: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout_s)


async def _stopped(running: _Running) -> None:
    running.stop.set()
    with contextlib.suppress(Exception):
        await running.task


async def consume_worlds(settings: Settings, stop: asyncio.Event) -> None:
    """A consumer for each world the worlds file names, following the file; without one,
    the settings' world alone. The stable world's consumer failing ends the process (as
    it always did); a candidate's is logged, and tried again once the file changes."""
    metrics = IngestMetrics()
    if settings.ingest_metrics_port:
        start_http_server(settings.ingest_metrics_port, settings.host, metrics.registry)
    if settings.worlds_file is None:
        await consume(settings, stop, metrics)
        return
    running: dict[WorldRef | None, _Running] = {}
    failed: set[WorldRef | None] = set()
    plan = read_worlds(settings.worlds_file)
    try:
        while not stop.is_set():
            wanted = [plan.stable, *([plan.candidate] if plan.candidate else [])]
            for ref, each in list(running.items()):
                if ref not in wanted:
                    await _stopped(running.pop(ref))
                elif each.task.done():
                    running.pop(ref)
                    exc = each.task.exception()
                    if ref == plan.stable and exc is not None:
                        raise exc
                    log.error("the consumer of candidate world %s stopped: %s", ref, exc)
                    failed.add(ref)
            for ref in wanted:
                if ref not in running and ref not in failed:
                    own = asyncio.Event()
                    task = asyncio.create_task(consume(world_settings(settings, ref), own, metrics))
                    running[ref] = _Running(own, task)
            await _wait(stop, WORLDS_POLL_S)
            try:
                changed = read_worlds(settings.worlds_file)
            except ConfigError as exc:
                log.error("the worlds file was not read: %s", exc)
                continue
            if changed != plan:
                plan, failed = changed, set()
    finally:
        for each in running.values():
            await _stopped(each)


def main() -> None:
    configure_logging()
    try:
        settings = load_settings()
        asyncio.run(until_signalled(lambda stop: consume_worlds(settings, stop)))
    except (ConfigError, RecsysError) as exc:
        log.error("recsys-ingest cannot start: %s", exc)
        sys.exit(2)
    log.info("recsys-ingest stopped")


if __name__ == "__main__":
    main()
