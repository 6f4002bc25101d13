"""Stage `features`: the user's stored features and the encoded request context."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt

from app.api_models import ClientContext
from app.clients.feature_store import FeatureStore
from app.context import RequestContext
from app.errors import FeatureStoreError
from app.packing import encode_context
from app.schema import FeatureSchema
from app.stages.types import UserFeatures


def _utc_now() -> datetime:
    return datetime.now(UTC)


class UserFeatureHydrator:
    """Reads the user's blob and seen items in one round trip; cold users get defaults."""

    def __init__(self, store: FeatureStore, clock: Callable[[], datetime] = _utc_now) -> None:
        self._store = store
        self._clock = clock

    def encode(self, schema: FeatureSchema, context: ClientContext) -> npt.NDArray[np.float32]:
        now = self._clock()
        hour = now.hour if context.hour is None else context.hour
        weekday = now.weekday() if context.weekday is None else context.weekday
        return encode_context(schema, context.device, context.page, context.locale, hour, weekday)

    async def hydrate(
        self, user_id: str, context: ClientContext, ctx: RequestContext
    ) -> UserFeatures:
        artifacts = ctx.artifacts
        encoded = self.encode(artifacts.schema, context)
        default_blob = artifacts.catalog.default_user_blob
        try:
            record = await self._store.user(user_id)
        except FeatureStoreError as exc:
            ctx.degrade("features", exc.kind)
            return UserFeatures(default_blob, encoded, frozenset(), cold_start=False)
        if record.blob is None:
            ctx.metrics.cold_start.inc()
            return UserFeatures(default_blob, encoded, frozenset(record.seen), cold_start=True)
        return UserFeatures(record.blob, encoded, frozenset(record.seen), cold_start=False)
