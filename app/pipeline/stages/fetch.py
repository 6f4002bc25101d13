"""Stage `fetch`: the candidates' item feature blobs, from memory or from Redis."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from app.clients.feature_store import ItemBlobs
from app.clients.item_memory import ItemMatrix
from app.core.errors import FailureKind, FeatureStoreError
from app.core.vocabulary import Positions, Stage
from app.pipeline.context import RequestContext
from app.pipeline.types import Hydrated, HydratedCandidates, Pool
from app.release.arrivals import CatalogRoom

# A few items without features is a catalog ahead of its feature store; more is an incident.
MISSING_SHARE_FLAGGED = 0.1
_NONE = np.empty(0, dtype=np.intp)


class ItemStore(Protocol):
    async def items(self, keys: Sequence[bytes], timeout_s: float) -> ItemBlobs: ...


class HeldMatrix(Protocol):
    @property
    def current(self) -> ItemMatrix: ...


def _flag_missing(hydrated: HydratedCandidates, ctx: RequestContext) -> None:
    missing = len(hydrated.positions) - len(hydrated.found)
    if missing > MISSING_SHARE_FLAGGED * len(hydrated.positions):
        ctx.degrade(
            Stage.FETCH,
            FailureKind.MISSING,
            f"{missing} of {len(hydrated.positions)} candidates have no features",
        )


class HeldItemHydrator:
    """Candidates' rows gathered from the item matrix held in memory: one take, no I/O."""

    stage = Stage.FETCH

    def __init__(self, held: HeldMatrix) -> None:
        self._held = held

    async def run(self, pool: Pool, ctx: RequestContext) -> Hydrated:
        positions = pool.positions
        matrix = self._held.current  # one snapshot: never half old, half new
        room = ctx.artifacts.catalog.room
        if room is not None and len(positions) and int(positions.max()) >= room.base:
            hydrated = _held_rows(positions, matrix, room)
        else:
            found = np.flatnonzero(matrix.usable[positions])
            hydrated = HydratedCandidates(
                positions, found, np.take(matrix.blobs, positions[found], 0)
            )
        _flag_missing(hydrated, ctx)
        return Hydrated(pool.asked, hydrated)


def _held_rows(positions: Positions, matrix: ItemMatrix, room: CatalogRoom) -> HydratedCandidates:
    """The world items' rows from the matrix, the added ones' from the room: one take of
    both (an added position takes a world row first, then its own over it)."""
    base = room.base
    added = np.flatnonzero(positions >= base)
    world_rows = np.minimum(positions, base - 1)
    usable = np.take(matrix.usable, world_rows)
    usable[added] = room.present[positions[added]]
    found = np.flatnonzero(usable)
    chosen = positions[found]
    rows = np.take(matrix.blobs, np.minimum(chosen, base - 1), axis=0)
    mine = np.flatnonzero(chosen >= base)
    rows[mine] = room.blobs[chosen[mine] - base]
    return HydratedCandidates(positions, found, rows)


def without_bad_rows(positions: Positions, blobs: ItemBlobs) -> tuple[HydratedCandidates, int]:
    """Drop candidates whose blob is malformed or holds NaN/Inf; also return how many."""
    finite = np.isfinite(blobs.matrix).all(axis=1)
    bad = np.concatenate([blobs.malformed, blobs.found[~finite]])
    if len(bad) == 0:
        return HydratedCandidates(positions, blobs.found, blobs.matrix), 0
    keep = np.ones(len(positions), dtype=bool)
    keep[bad] = False
    renumbered = np.cumsum(keep) - 1
    hydrated = HydratedCandidates(
        positions[keep], renumbered[blobs.found[finite]], blobs.matrix[finite]
    )
    return hydrated, len(bad)


class ItemFeatureHydrator:
    """Reads the candidates' blobs from Redis per request (RECSYS_ITEM_FEATURES=off).

    Keeps every candidate in recall order, with the blobs of those that have good ones.
    """

    stage = Stage.FETCH

    def __init__(self, store: ItemStore, timeout_s: float) -> None:
        self._store = store
        self._timeout_s = timeout_s

    async def run(self, pool: Pool, ctx: RequestContext) -> Hydrated:
        return Hydrated(pool.asked, await self._read(pool.positions, ctx))

    async def _read(self, positions: Positions, ctx: RequestContext) -> HydratedCandidates:
        artifacts = ctx.artifacts
        keys = artifacts.keys_at(positions)
        try:
            blobs = await self._store.items(keys, ctx.time_for(self._timeout_s))
        except FeatureStoreError as exc:
            ctx.degrade(Stage.FETCH, exc.kind, exc)
            width = artifacts.schema.item_blob_width
            return HydratedCandidates(positions, _NONE, np.empty((0, width), np.float32))
        hydrated, bad = without_bad_rows(positions, blobs)
        if bad:
            ctx.degrade(
                Stage.FETCH, FailureKind.BAD_DATA, f"{bad} item blobs malformed or not finite"
            )
        _flag_missing(hydrated, ctx)
        return hydrated
