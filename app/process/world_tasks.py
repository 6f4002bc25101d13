"""What runs beside the requests for as long as one world is served.

Each world served (the stable one, and a candidate beside it) refreshes its own trending
items, catalog changes, exposure counts, held item features and answer log, and watches its
own data in Redis; its tasks stop when the world is retired.
"""

from __future__ import annotations

import asyncio
import logging

from app.clients.catalog_compactor import keep_small
from app.process.health import watch_redis_world
from app.process.services import Services

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 10.0
RECANCEL_S = 0.5


# How often the catalog's change log is measured (and compacted past its size), and how
# long its reads and its replacement may take (a fold of tens of thousands of items).
COMPACT_CHECK_S = 5.0
COMPACT_TIMEOUT_S = 30.0


def world_tasks(services: Services, stable: bool = True) -> list[asyncio.Task[None]]:
    """The world's tasks; only the stable world's watch of its Redis data sets the gauges
    (`recsys_redis_world`, `recsys_world_age_seconds`) that speak of the world served."""
    settings = services.settings
    tasks = watch_task(services) if stable else []
    served = services.served
    trending = served.trending.keep_current(settings.trending_refresh_s, settings.redis_timeout_s)
    if settings.trending_candidates:
        tasks.append(asyncio.create_task(trending, name="trending"))
    else:
        trending.close()
    if served.catalog_follower is not None:
        following = served.catalog_follower.keep_current(
            settings.catalog_follow_s, max(settings.redis_timeout_s, 1.0)
        )
        tasks.append(asyncio.create_task(following, name="catalog-changes"))
        assert served.catalog_log is not None  # the follower follows it
        room = served.artifacts.current.catalog.room
        assert room is not None
        compacting = keep_small(
            served.catalog_log,
            room.check,
            services.metrics.catalog_log_entries.set,
            COMPACT_CHECK_S,
            settings.catalog_compact_entries,
            COMPACT_TIMEOUT_S,
        )
        tasks.append(asyncio.create_task(compacting, name="catalog-compaction"))
    if served.exposure is not None:
        exposing = served.exposure.keep_current(
            settings.exposure_refresh_s, max(settings.redis_timeout_s, 1.0)
        )
        tasks.append(asyncio.create_task(exposing, name="exposure"))
    if served.item_memory is not None:
        refreshing = served.item_memory.keep_current(settings.item_refresh_s)
        tasks.append(asyncio.create_task(refreshing, name="item-features"))
    if services.answers is not None:
        flushing = services.answers.keep_flushing(settings.answer_log_flush_s)
        tasks.append(asyncio.create_task(flushing, name="answer-log"))
    return tasks


def watch_task(services: Services) -> list[asyncio.Task[None]]:
    """The watch of the world's data in Redis, which speaks for the world served."""
    return [asyncio.create_task(watch_redis_world(services), name="redis-world")]


async def stop_tasks(tasks: list[asyncio.Task[None]], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Cancel the tasks and wait for them to end. A cancellation that lands inside a client's
    read can be swallowed there, so it is sent again until each task ends; one that will not
    is left behind, named in the log, rather than holding up a shutdown or a retirement."""
    pending = {task for task in tasks if not task.done()}
    give_up = asyncio.get_running_loop().time() + timeout_s
    while pending and asyncio.get_running_loop().time() < give_up:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("task %s had failed: %r", task.get_name(), task.exception())
    if pending:
        log.error(
            "tasks still running after %.0f s: %s", timeout_s, [t.get_name() for t in pending]
        )
