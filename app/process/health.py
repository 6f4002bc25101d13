"""Readiness: what a load balancer needs to know to send this instance traffic or not.

Not ready before start-up has loaded the index and checked the model and the Redis layout
(the server does not listen until then). After that, what is local to this host decides:
its Triton's model must be ready and still match the schema, and the instance must not be
draining. Redis is shared by every instance: when it fails, answers degrade, but taking
every instance out of rotation at once would turn a degraded service into an outage, so it
is reported and does not fail readiness.

Both also say whether they still hold the served world: `model_world` fails readiness (this
host's Triton now answers with another world's model), `redis_world` is reported. A Redis
with no layout record at all (flushed, restarted without persistence) holds no world: its
`redis_world` is false, never taken for a load made before stamping. `watch_redis_world`
reads the same every second for the `recsys_redis_world` gauge, so the alert on a lost
world does not wait for a probe.
"""

from __future__ import annotations

import asyncio
import time

from app.core.errors import RankingModelError
from app.core.vocabulary import RedisWorld
from app.process.services import Services
from app.release.world_match import redis_world, same_world
from app.world.schema import signature_mismatches
from app.world.stamp import built_at

CHECK_TIMEOUT_S = 0.5
# How often the world Redis holds is read for the gauge: the alert fires minutes later, the
# gauge must say it within seconds of the loss.
WATCH_INTERVAL_S = 1.0
# The checks that make the instance not ready when they fail.
DECIDING = ("index", "triton", "schema", "model_world", "serving")


def _same_world(services: Services, found: str | None) -> bool:
    return same_world(found, services.served.world_id)


async def _model_checks(services: Services) -> dict[str, bool]:
    try:
        signature = await services.model.ready_signature(CHECK_TIMEOUT_S)
    except RankingModelError:
        return {"triton": False, "schema": False, "model_world": False}
    schema = services.served.artifacts.current.schema
    return {
        "triton": True,
        "schema": not signature_mismatches(schema, signature),
        "model_world": _same_world(services, signature.world_id),
    }


async def held_world(services: Services) -> RedisWorld:
    """What Redis holds against the served world, noted in the recsys_redis_world gauge.
    Reading the layout record is the liveness check too."""
    answered, found = await services.store.world_state(CHECK_TIMEOUT_S)
    held = redis_world(answered, found, services.served.world_id)
    services.metrics.note_redis_world(held)
    _note_world_age(services)
    return held


def _note_world_age(services: Services) -> None:
    built = built_at(services.served.world_id) if services.served.stamp else None
    if built is not None:
        services.metrics.world_age.set(max(0.0, time.time() - built))


async def watch_redis_world(services: Services, interval_s: float = WATCH_INTERVAL_S) -> None:
    """held_world every `interval_s`, for as long as the service runs."""
    task = asyncio.current_task()
    while True:
        await held_world(services)
        # A cancellation that lands inside the Redis client's read can be swallowed there;
        # the task still says it is being cancelled, and stops here instead of looping on.
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        await asyncio.sleep(interval_s)


async def _redis_checks(services: Services) -> dict[str, bool]:
    held = await held_world(services)
    return {
        "redis": held is not RedisWorld.UNKNOWN,
        "redis_world": held in (RedisWorld.SERVED, RedisWorld.UNSTAMPED),
    }


async def _dependency_checks(services: Services) -> dict[str, bool]:
    redis, model = await asyncio.gather(_redis_checks(services), _model_checks(services))
    return {**model, **redis}


async def readiness(services: Services) -> dict[str, bool]:
    """One entry per part: the deciding ones, and redis and its world (reported only).

    The dependencies are asked at most once a second (app.process.services.READINESS_TTL_S), however
    often and by however many a load balancer asks: a flood of /readyz cannot become a flood
    of calls to Redis and Triton. What is local (the index, draining) is read every time,
    so a SIGTERM takes the instance out of rotation at once.
    """
    catalog = services.served.artifacts.current.catalog
    dependencies = await services.readiness_checks.get(lambda: _dependency_checks(services))
    return {
        "index": catalog.index.ntotal == catalog.world_size > 0,
        **dependencies,
        "serving": not services.draining,
    }


def failing(checks: dict[str, bool]) -> list[str]:
    return sorted(name for name in DECIDING if not checks[name])
