"""Readiness: every part a request needs, checked and named."""

from __future__ import annotations

from app.errors import RankingModelError
from app.schema import signature_mismatches
from app.services import Services

CHECK_TIMEOUT_S = 0.5


async def readiness(services: Services) -> dict[str, bool]:
    """One entry per part: redis, triton (model ready), index (loaded), schema (model agrees)."""
    artifacts = services.artifacts.current
    redis_ok = await services.store.ping(CHECK_TIMEOUT_S)
    try:
        signature = await services.model.ready_signature(CHECK_TIMEOUT_S)
    except RankingModelError:
        triton_ok = schema_ok = False
    else:
        triton_ok = True
        schema_ok = not signature_mismatches(artifacts.schema, signature)
    return {
        "redis": redis_ok,
        "triton": triton_ok,
        "index": artifacts.catalog.index.ntotal == artifacts.catalog.size > 0,
        "schema": schema_ok,
    }
