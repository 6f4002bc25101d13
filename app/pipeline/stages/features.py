"""Stage `features`: the user's stored features and the encoded request context."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

import numpy as np
import numpy.typing as npt

from app.clients.feature_store import BlobState, UserRecord
from app.core.errors import FailureKind, FeatureStoreError
from app.core.vocabulary import Positions, Stage, Viewed
from app.pipeline.context import RequestContext
from app.pipeline.packing import encode_context
from app.pipeline.types import Asked, Moment, Query, UserFeatures
from app.release.artifacts import ServingArtifacts
from app.release.catalog import Catalog
from app.world.neighbours import NOWHERE, Nearby
from app.world.order import Taste, taste_of
from app.world.schema import FeatureSchema

NOTHING_SEEN: Positions = np.empty(0, dtype=np.int64)


class UserLookup(Protocol):
    async def user(self, user_id: str, timeout_s: float) -> UserRecord: ...


class CatalogHead(Protocol):
    async def at_least(self, seq: int, timeout_s: float) -> ServingArtifacts:
        """The artifacts once the catalog's change log is applied up to `seq`."""
        ...


def _utc_now() -> datetime:
    return datetime.now(UTC)


class UserFeatureHydrator:
    """Reads the user's blob, seen items and latest positives in one round trip; falls back
    to defaults. The items near those positives (the world's neighbours, a more recent one
    counting more by `decay`) are found here, once, for every later stage.

    A user without stored features is a cold start (defaults, not degraded); a store that
    cannot answer, or a blob that is malformed or holds NaN/Inf, gives the same defaults and
    flags the answer.
    """

    stage = Stage.FEATURES

    def __init__(
        self,
        store: UserLookup,
        timeout_s: float,
        clock: Callable[[], datetime] = _utc_now,
        decay: float = 0.9,
        catalog: CatalogHead | None = None,
    ) -> None:
        self._store = store
        self._timeout_s = timeout_s
        self._clock = clock
        self._decay = decay
        self._catalog = catalog

    def encode(self, schema: FeatureSchema, moment: Moment) -> npt.NDArray[np.float32]:
        now = self._clock()
        hour = now.hour if moment.hour is None else moment.hour
        weekday = now.weekday() if moment.weekday is None else moment.weekday
        return encode_context(schema, moment.device, moment.page, moment.locale, hour, weekday)

    async def _follow_catalog(self, catalog: CatalogHead, seq: int, ctx: RequestContext) -> None:
        """Answer from a catalog holding every withdrawal acknowledged before the request:
        a withdrawn item is never served after its acknowledgement (`seq`: the last batch
        that withdrew)."""
        try:
            ctx.artifacts = await catalog.at_least(seq, ctx.time_for(self._timeout_s))
        except FeatureStoreError as exc:
            ctx.degrade(Stage.FEATURES, exc.kind, exc)

    async def run(self, query: Query, ctx: RequestContext) -> Asked:
        return Asked(query, await self._user(query, ctx))

    async def _user(self, query: Query, ctx: RequestContext) -> UserFeatures:
        encoded = self.encode(ctx.artifacts.schema, query.moment)
        default_blob = ctx.artifacts.catalog.default_user_blob
        try:
            record = await self._store.user(query.user_id, ctx.time_for(self._timeout_s))
        except FeatureStoreError as exc:
            ctx.degrade(Stage.FEATURES, exc.kind, exc)
            viewed = _viewed_at(query, ctx)
            recent, nearby, taste = self._latest(NOTHING_SEEN, viewed, ctx.artifacts.catalog)
            return UserFeatures(
                default_blob, encoded, NOTHING_SEEN, False, recent, nearby, viewed, taste
            )
        if self._catalog is not None and record.catalog_seq:
            await self._follow_catalog(self._catalog, record.catalog_seq, ctx)
        seen = record.seen
        catalog = ctx.artifacts.catalog
        viewed = _viewed_at(query, ctx)
        recent, nearby, taste = self._latest(
            record.recent[record.recent < catalog.size], viewed, catalog
        )
        known = seen < catalog.size
        if not record.seen_whole or not known.all():
            seen = seen[known]
            ctx.degrade(
                Stage.FEATURES,
                FailureKind.BAD_DATA,
                "seen list torn or naming positions past the catalog",
            )
        if record.state is BlobState.ABSENT:
            ctx.metrics.cold_start.inc()
            return UserFeatures(default_blob, encoded, seen, True, recent, nearby, viewed, taste)
        if record.blob is None or not np.isfinite(record.blob).all():
            ctx.degrade(Stage.FEATURES, FailureKind.BAD_DATA, "user blob malformed or not finite")
            return UserFeatures(default_blob, encoded, seen, False, recent, nearby, viewed, taste)
        return UserFeatures(record.blob, encoded, seen, False, recent, nearby, viewed, taste)

    def _latest(
        self, recent: Positions, viewed: int, catalog: Catalog
    ) -> tuple[Positions, Nearby, Taste]:
        """The latest positives, the viewed item last (the latest signal of all), the items
        near them, and what the order model makes of them."""
        if viewed >= 0:
            recent = np.append(recent[recent != viewed], np.int64(viewed))
        nearby = (
            NOWHERE
            if catalog.neighbours is None
            else catalog.neighbours.around(recent, self._decay)
        )
        return recent, nearby, taste_of(catalog.order, recent)


def _viewed_at(query: Query, ctx: RequestContext) -> int:
    """The position of the item the request's page shows (-1: none, or one the catalog
    lacks), counted by page. A withdrawn item keeps its position: the page of an item out
    of stock still asks for what is like it, and the filters keep the item out."""
    artifacts = ctx.artifacts
    page = artifacts.page(query.moment.page).name
    if query.viewed_item_id is None:
        ctx.metrics.page_request(page, Viewed.NONE)
        return -1
    position = int(artifacts.lookup([query.viewed_item_id])[0])
    ctx.metrics.page_request(page, Viewed.KNOWN if position >= 0 else Viewed.UNKNOWN)
    if ctx.trace is not None:
        ctx.trace.record(Stage.FEATURES).facts["viewed_position"] = position
    return position
