"""Stage `fetch`: the candidates' item feature blobs from Redis."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.clients.feature_store import FeatureStore
from app.context import RequestContext
from app.errors import FailureKind, FeatureStoreError
from app.stages.types import HydratedCandidates


class ItemFeatureHydrator:
    """Keeps the candidates that have well-formed blobs, in recall order."""

    def __init__(self, store: FeatureStore) -> None:
        self._store = store

    async def hydrate(
        self, positions: npt.NDArray[np.int64], ctx: RequestContext
    ) -> HydratedCandidates:
        keys: list[bytes] = ctx.artifacts.item_keys[positions].tolist()
        try:
            blobs = await self._store.items(keys)
        except FeatureStoreError as exc:
            ctx.degrade("fetch", exc.kind)
            return HydratedCandidates(positions, None)
        if blobs.malformed:
            ctx.degrade("fetch", FailureKind.BAD_DATA)
        return HydratedCandidates(positions[blobs.found], blobs.matrix)
